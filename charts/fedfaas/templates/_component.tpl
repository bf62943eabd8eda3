{{/* A stateless FedFaaS service: Deployment + ClusterIP Service, non-root, read-only root
     filesystem, its secret files (only those) mounted read-only at /var/secrets, /healthz probes.
     Call with (dict "ctx" $ "name" "request-tracker" "c" .Values.requestTracker
                     "prefix" "FEDFAAS_TRACKER_" "env" (list (dict "name" "X" "value" "y"))
                     "files" (dict "redis" "request-tracker" "tokens" (list "admin-token"))
                     "serviceAccount" ""); "files" as fedfaas.secretFiles takes them. The
     component's settings class reads <prefix>HOST and <prefix>PORT, and `env` gives it the
     paths of its files. */}}
{{- define "fedfaas.component" -}}
{{- $ctx := .ctx -}}
{{- $fullname := include "fedfaas.fullname" $ctx -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}-{{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "fedfaas.labels" (dict "ctx" $ctx "component" .name) | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "fedfaas.selectorLabels" (dict "ctx" $ctx "component" .name) | nindent 4 }}
  ports:
    - name: http
      port: {{ .c.port }}
      targetPort: http
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $fullname }}-{{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "fedfaas.labels" (dict "ctx" $ctx "component" .name) | nindent 4 }}
spec:
  replicas: {{ .c.replicas }}
  selector:
    matchLabels:
      {{- include "fedfaas.selectorLabels" (dict "ctx" $ctx "component" .name) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "fedfaas.labels" (dict "ctx" $ctx "component" .name) | nindent 8 }}
    spec:
      {{- with .serviceAccount }}
      serviceAccountName: {{ . }}
      {{- end }}
      securityContext:
        # the secret files are group-readable by this group only (mode 0440)
        fsGroup: 12000
      {{- with $ctx.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .name }}
          image: {{ include "fedfaas.image" (dict "ctx" $ctx "image" $ctx.Values.image) }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          command:
            {{- toYaml .c.command | nindent 12 }}
          args:
            {{- include "fedfaas.logArgs" $ctx | nindent 12 }}
          env:
            - name: {{ .prefix }}HOST
              value: "0.0.0.0"
            - name: {{ .prefix }}PORT
              value: {{ .c.port | quote }}
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with .c.env }}
            {{- include "fedfaas.extraEnv" . | trim | nindent 12 }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ .c.port }}
          readinessProbe:
            httpGet:
              path: /healthz
              port: http
            periodSeconds: 5
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            periodSeconds: 10
            failureThreshold: 6
          securityContext:
            {{- include "fedfaas.restrictedContainer" $ctx | nindent 12 }}
          resources:
            {{- toYaml .c.resources | nindent 12 }}
          volumeMounts:
            {{- include "fedfaas.secretsMount" $ctx | nindent 12 }}
            - name: tmp
              mountPath: /tmp
      volumes:
        {{- include "fedfaas.secretsVolume" (merge (dict "ctx" $ctx) .files) | nindent 8 }}
        - name: tmp
          emptyDir: {}
      {{- include "fedfaas.placement" (dict "ctx" $ctx "c" .c) | nindent 6 }}
{{- end -}}

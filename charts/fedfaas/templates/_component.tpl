{{/* A stateless FedFaaS service: Deployment + ClusterIP Service, non-root, read-only root
     filesystem, its secret files (only those) mounted read-only at /var/secrets, /healthz probes.
     Call with (dict "ctx" $ "name" "request-tracker" "c" .Values.requestTracker
                     "prefix" "FEDFAAS_TRACKER_" "env" (list (dict "name" "X" "value" "y"))
                     "files" (dict "redis" "request-tracker" "tokens" (list "admin-token"))
                     "serviceAccount" "" "clientCerts" "optional"); "files" as
     fedfaas.secretFiles takes them. The component's settings class reads <prefix>HOST and
     <prefix>PORT, and `env` gives it the paths of its files; with tls.enabled it serves HTTPS
     from its Secret "<tls prefix>-<name>" (_helpers.tpl, TLS), asking clients for certificates as
     "clientCerts" says. */}}
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
      {{- if $ctx.Values.tls.enabled }}
      initContainers:
        {{- include "fedfaas.tlsInit" (dict "ctx" $ctx "uid" 12000) | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .name }}
          image: {{ include "fedfaas.image" (dict "ctx" $ctx "image" $ctx.Values.image) }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          command:
            {{- toYaml .c.command | nindent 12 }}
          args:
            {{- include "fedfaas.logArgs" $ctx | nindent 12 }}
            {{- if $ctx.Values.tls.enabled }}
            {{- include "fedfaas.tlsArgs" (dict "clientCerts" .clientCerts) | nindent 12 }}
            {{- end }}
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
          {{- include "fedfaas.probes" (dict "ctx" $ctx "clientCerts" .clientCerts) | nindent 10 }}
          securityContext:
            {{- include "fedfaas.restrictedContainer" $ctx | nindent 12 }}
          resources:
            {{- toYaml .c.resources | nindent 12 }}
          volumeMounts:
            {{- include "fedfaas.secretsMount" $ctx | nindent 12 }}
            {{- if $ctx.Values.tls.enabled }}
            {{- include "fedfaas.tlsMount" $ctx | nindent 12 }}
            {{- end }}
            - name: tmp
              mountPath: /tmp
      volumes:
        {{- include "fedfaas.secretsVolume" (merge (dict "ctx" $ctx) .files) | nindent 8 }}
        {{- if $ctx.Values.tls.enabled }}
        {{- include "fedfaas.tlsVolumes" (dict "ctx" $ctx "part" .name) | nindent 8 }}
        {{- end }}
        - name: tmp
          emptyDir: {}
      {{- include "fedfaas.placement" (dict "ctx" $ctx "c" .c) | nindent 6 }}
{{- end -}}

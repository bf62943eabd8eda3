{{/* Names, labels and images, following the OpenFaaS charts (openfaas.name / fullname / image). */}}

{{- define "fedfaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedfaas.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fedfaas.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object: the connector-chart set plus app.kubernetes.io/*.
     Call with (dict "ctx" $ "component" "minio"). */}}
{{- define "fedfaas.labels" -}}
app: {{ include "fedfaas.name" .ctx }}
chart: {{ include "fedfaas.chart" .ctx }}
component: {{ .component }}
heritage: {{ .ctx.Release.Service }}
release: {{ .ctx.Release.Name }}
app.kubernetes.io/name: {{ include "fedfaas.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: fedfaas
{{- end -}}

{{/* Selector labels: stable across upgrades. */}}
{{- define "fedfaas.selectorLabels" -}}
app: {{ include "fedfaas.name" .ctx }}
release: {{ .ctx.Release.Name }}
component: {{ .component }}
{{- end -}}

{{/* "repository:tag" with registryPrefix applied; tag defaults to appVersion.
     Call with (dict "ctx" $ "image" .Values.x.image). */}}
{{- define "fedfaas.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .image.tag -}}
{{- if .ctx.Values.registryPrefix -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .ctx.Values.registryPrefix) .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "fedfaas.minioSecret" -}}
{{- default (printf "%s-minio" (include "fedfaas.fullname" .)) .Values.minio.existingSecret -}}
{{- end -}}

{{/* Where everything is, as environment variables (same names as `fedfaas up` gives its
     parts). Secrets are files, never values. */}}
{{- define "fedfaas.redisURL" -}}
{{- printf "redis://%s-redis.%s:%d/0" (include "fedfaas.fullname" .) .Release.Namespace (int .Values.redis.port) -}}
{{- end -}}

{{- define "fedfaas.minioEndpoint" -}}
{{- printf "%s-minio.%s:%d" (include "fedfaas.fullname" .) .Release.Namespace (int .Values.minio.apiPort) -}}
{{- end -}}

{{/* <prefix>MINIO_ACCESS_KEY / <prefix>MINIO_SECRET_KEY from the MinIO secret, for settings
     classes that take the keys as values. Call with (dict "ctx" $ "prefix" "FEDFAAS_ENGINE_"). */}}
{{- define "fedfaas.minioKeyEnv" -}}
- name: {{ .prefix }}MINIO_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "fedfaas.minioSecret" .ctx }}
      key: root-user
- name: {{ .prefix }}MINIO_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "fedfaas.minioSecret" .ctx }}
      key: root-password
{{- end -}}

{{- define "fedfaas.env" -}}
- name: FEDFAAS_REDIS_URL
  value: {{ include "fedfaas.redisURL" . | quote }}
- name: FEDFAAS_MINIO_ENDPOINT
  value: {{ include "fedfaas.minioEndpoint" . | quote }}
- name: FEDFAAS_MINIO_BUCKET
  value: {{ .Values.minio.bucket | quote }}
- name: FEDFAAS_MINIO_ACCESS_KEY_FILE
  value: /var/secrets/minio/root-user
- name: FEDFAAS_MINIO_SECRET_KEY_FILE
  value: /var/secrets/minio/root-password
- name: FEDFAAS_RUNTIME_URL
  value: {{ .Values.gatewayURL | quote }}
- name: OPENFAAS_URL
  value: {{ .Values.gatewayURL | quote }}
- name: FEDFAAS_FUNCTION_NAMESPACE
  value: {{ .Values.functionNamespace | quote }}
- name: FEDFAAS_SECRETS_DIR
  value: /var/secrets
- name: basic_auth
  value: {{ .Values.basicAuth | quote }}
- name: secret_mount_path
  value: /var/secrets
- name: FEDFAAS_LOG_LEVEL
  value: {{ ternary "DEBUG" "INFO" .Values.logs.debug | quote }}
- name: FEDFAAS_LOG_FORMAT
  value: {{ .Values.logs.format | quote }}
{{- end -}}

{{/* Extra env of a component, from its `env` map. */}}
{{- define "fedfaas.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* Secrets mounted read-only: OpenFaaS basic-auth at /var/secrets, MinIO credentials at
     /var/secrets/minio. */}}
{{- define "fedfaas.secretMounts" -}}
{{- if .Values.basicAuth }}
- name: auth
  mountPath: /var/secrets
  readOnly: true
{{- end }}
- name: minio-credentials
  mountPath: /var/secrets/minio
  readOnly: true
{{- end -}}

{{- define "fedfaas.secretVolumes" -}}
{{- if .Values.basicAuth }}
- name: auth
  secret:
    secretName: {{ .Values.basicAuthSecret }}
{{- end }}
- name: minio-credentials
  secret:
    secretName: {{ include "fedfaas.minioSecret" . }}
{{- end -}}

{{/* Placement: the component's own value, else the chart-wide one.
     Call with (dict "ctx" $ "c" .Values.component). */}}
{{- define "fedfaas.placement" -}}
{{- with (default .ctx.Values.nodeSelector .c.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .ctx.Values.tolerations .c.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .ctx.Values.affinity .c.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Non-root, read-only root filesystem, no capabilities (the stateless components). */}}
{{- define "fedfaas.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 12000
capabilities:
  drop: ["ALL"]
{{- end -}}

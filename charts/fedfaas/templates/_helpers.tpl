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

{{/* Where Redis and MinIO are, for the components' settings (`*_REDIS_URL`, `*_MINIO_ENDPOINT`). */}}
{{- define "fedfaas.redisURL" -}}
{{- printf "redis://%s-redis.%s:%d/0" (include "fedfaas.fullname" .) .Release.Namespace (int .Values.redis.port) -}}
{{- end -}}

{{- define "fedfaas.minioEndpoint" -}}
{{- printf "%s-minio.%s:%d" (include "fedfaas.fullname" .) .Release.Namespace (int .Values.minio.apiPort) -}}
{{- end -}}

{{/* Extra env of a component, from its `env` map. */}}
{{- define "fedfaas.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* The command-line tail every FedFaaS component takes (core/cmdline.py). */}}
{{- define "fedfaas.logArgs" -}}
- --log-level
- {{ ternary "DEBUG" "INFO" .Values.logs.debug }}
{{- end -}}

{{/* ---- Secrets. Every secret is a file: components get PATHS (settings `*_file`), never
     values, and each pod mounts only the files it needs (secrets.yaml makes them). */}}

{{- define "fedfaas.tokensSecret" -}}
{{- printf "%s-tokens" (include "fedfaas.fullname" .) -}}
{{- end -}}

{{- define "fedfaas.minioUsersSecret" -}}
{{- printf "%s-minio-users" (include "fedfaas.fullname" .) -}}
{{- end -}}

{{- define "fedfaas.redisUsersSecret" -}}
{{- printf "%s-redis-users" (include "fedfaas.fullname" .) -}}
{{- end -}}

{{- define "fedfaas.redisACLSecret" -}}
{{- printf "%s-redis-acl" (include "fedfaas.fullname" .) -}}
{{- end -}}

{{/* The OpenFaaS secret every function requires (runtime/function_auth.py TOKEN_SECRET);
     faas-netes mounts it at /var/openfaas/secrets/fedfaas-function-token. */}}
{{- define "fedfaas.functionTokenSecret" -}}
fedfaas-function-token
{{- end -}}

{{/* MinIO component users: the keys of core/services/minio_server.py minio_policies(). Their policies are
     made by the hook Job (python -m fedfaas.provision_minio) from that same function;
     tests/platform/test_chart.py keeps this list equal to it. */}}
{{- define "fedfaas.minioUsers" -}}
- gateway
- cache-engine
{{- end -}}

{{/* Redis ACL users (`default` is off): the table REDIS_USERS of core/services/redis_server.py, user ->
     key patterns and commands; tests/platform/test_chart.py keeps the two equal. */}}
{{- define "fedfaas.redisUsers" -}}
admin: "~* &* +@all"
gateway: "~fedfaas:* resetchannels +@all -@dangerous -@admin"
control-plane: "~fedfaas:control:* resetchannels +@all -@dangerous -@admin"
cache-engine: "~flstore:* resetchannels &flstore:changes +@all -@dangerous -@admin"
request-tracker: "~flstore:* resetchannels &flstore:changes +@all -@dangerous -@admin"
baseline: "~baseline:* resetchannels +@all -@dangerous -@admin"
runtime: "~runtime:async:* resetchannels +@all -@dangerous -@admin"
{{- end -}}

{{/* The files of one component, as the items of a projected volume mounted read-only at
     /var/secrets: file name -> (secret, key). The names are those of `fedfaas up`'s secrets
     folder. Call with (dict "ctx" $ "redis" "gateway" "minio" "gateway" "basicAuth" true
     "tokens" (list "service-token")); every argument but ctx is optional. */}}
{{- define "fedfaas.secretFiles" -}}
{{- $ctx := .ctx -}}
{{- if .redis }}
- secret:
    name: {{ include "fedfaas.redisUsersSecret" $ctx }}
    items:
      - key: redis-{{ .redis }}.json
        path: redis-{{ .redis }}.json
{{- end }}
{{- if .minio }}
- secret:
    name: {{ include "fedfaas.minioUsersSecret" $ctx }}
    items:
      - key: minio-{{ .minio }}.json
        path: minio-{{ .minio }}.json
{{- end }}
{{- with .tokens }}
- secret:
    name: {{ include "fedfaas.tokensSecret" $ctx }}
    items:
      {{- range . }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end }}
{{- if and .basicAuth $ctx.Values.basicAuth }}
- secret:
    name: {{ $ctx.Values.basicAuthSecret }}
    items:
      - key: basic-auth-user
        path: basic-auth-user
      - key: basic-auth-password
        path: basic-auth-password
{{- end }}
{{- end -}}

{{/* The volume of those files; owner root, group the pod's fsGroup, mode 0440 (a non-root
     container reads them through its fsGroup). Same arguments as fedfaas.secretFiles. */}}
{{- define "fedfaas.secretsVolume" -}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      {{- include "fedfaas.secretFiles" . | nindent 6 }}
{{- end -}}

{{- define "fedfaas.secretsMount" -}}
- name: secrets
  mountPath: /var/secrets
  readOnly: true
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

{{/* The uid of the node gateway and the aggregator pods, which share the node's object store
     (objects are 0600 files of the gateway's uid) and its router socket (peers checked with
     SO_PEERCRED): 12000, the uid of the images (docker/, template/python3-http), or 0 where
     the gateway loads eBPF (a privileged container) and owns the store as root. */}}
{{- define "fedfaas.nodeUid" -}}
{{- ternary 0 12000 .Values.nodeGateway.ebpf.enabled -}}
{{- end -}}

{{/* The aggregator's container: the gateway's uid, no capabilities, read-only root. */}}
{{- define "fedfaas.nodeContainer" -}}
{{- $uid := int (include "fedfaas.nodeUid" .) -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: {{ ne $uid 0 }}
runAsUser: {{ $uid }}
runAsGroup: {{ $uid }}
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* ---- TLS (issue 41; values `tls`). Each TLS part (node-gateway, control-plane,
     cache-engine, request-tracker) reads its certificate, key and the platform's CA from the
     Secret "<prefix>-<part>" (keys tls.crt, tls.key, ca.crt: the layout of a kubernetes.io/tls
     Secret and of the Secrets cert-manager writes), where <prefix> is tls.secretName, or
     "<fullname>-tls" when it is empty. The parts refuse a key that others, its group included,
     can read (core.tls: 0600), and a Secret volume is group-readable under the pod's fsGroup:
     an init container, as the part's uid, copies the three files into a memory emptyDir with
     mode 0600, which the part mounts read-only at /var/tls; the Secret itself is mounted in the
     init container only. */}}

{{- define "fedfaas.tlsPrefix" -}}
{{- default (printf "%s-tls" (include "fedfaas.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{/* The Secret of the CA the chart generates (tls-generated.yaml): its certificate and key. */}}
{{- define "fedfaas.tlsCaSecret" -}}
{{- printf "%s-tls-ca" (include "fedfaas.fullname" .) -}}
{{- end -}}

{{/* The Secret of one part. Call with (dict "ctx" $ "part" "node-gateway"). */}}
{{- define "fedfaas.tlsSecret" -}}
{{- printf "%s-%s" (include "fedfaas.tlsPrefix" .ctx) .part -}}
{{- end -}}

{{/* http or https: the scheme of the parts' own URLs. */}}
{{- define "fedfaas.scheme" -}}
{{- ternary "https" "http" .Values.tls.enabled -}}
{{- end -}}

{{/* The part's TLS settings, as its command line's flags (every part's settings FLAGS).
     Call with (dict "clientCerts" "required"). */}}
{{- define "fedfaas.tlsArgs" -}}
- --tls-cert-file
- /var/tls/tls.crt
- --tls-key-file
- /var/tls/tls.key
- --tls-ca-file
- /var/tls/ca.crt
- --tls-client-certs
- {{ .clientCerts }}
{{- end }}

{{/* The init container that copies the part's Secret into /var/tls, 0600 files of `uid`.
     Call with (dict "ctx" $ "uid" 12000). */}}
{{- define "fedfaas.tlsInit" -}}
- name: tls-files
  image: {{ include "fedfaas.image" (dict "ctx" .ctx "image" .ctx.Values.image) }}
  imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
  command: ["sh", "-c", "umask 077 && cp /var/tls-secret/tls.crt /var/tls-secret/tls.key /var/tls-secret/ca.crt /var/tls/"]
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    runAsNonRoot: {{ ne (int .uid) 0 }}
    runAsUser: {{ .uid }}
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: tls-secret
      mountPath: /var/tls-secret
      readOnly: true
    - name: tls
      mountPath: /var/tls
{{- end -}}

{{- define "fedfaas.tlsMount" -}}
- name: tls
  mountPath: /var/tls
  readOnly: true
{{- end -}}

{{/* The Secret (init container only) and the emptyDir of its copies. Call with
     (dict "ctx" $ "part" "node-gateway"). */}}
{{- define "fedfaas.tlsVolumes" -}}
- name: tls-secret
  secret:
    secretName: {{ include "fedfaas.tlsSecret" . }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      - key: ca.crt
        path: ca.crt
- name: tls
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

{{/* readinessProbe and livenessProbe on /healthz: over HTTPS with TLS (kubelet verifies no
     certificate and presents none), a TCP connect where the part requires client
     certificates (kubelet has none to present). Call with (dict "ctx" $ "clientCerts" "..."). */}}
{{- define "fedfaas.probes" -}}
{{- $probe := dict "httpGet" (dict "path" "/healthz" "port" "http") -}}
{{- if and .ctx.Values.tls.enabled (eq .clientCerts "required") -}}
{{- $probe = dict "tcpSocket" (dict "port" "http") -}}
{{- else if .ctx.Values.tls.enabled -}}
{{- $probe = dict "httpGet" (dict "path" "/healthz" "port" "http" "scheme" "HTTPS") -}}
{{- end -}}
readinessProbe:
  {{- toYaml $probe | nindent 2 }}
  periodSeconds: 5
livenessProbe:
  {{- toYaml $probe | nindent 2 }}
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/* The DNS names of a part's Service "<fullname>-<part>" in the release's namespace. Call with
     (dict "ctx" $ "service" "fedfaas-cache-engine"). */}}
{{- define "fedfaas.serviceNames" -}}
{{- $ns := .ctx.Release.Namespace -}}
- {{ .service }}
- {{ .service }}.{{ $ns }}
- {{ .service }}.{{ $ns }}.svc
- {{ .service }}.{{ $ns }}.svc.cluster.local
{{- end -}}


{{/* The names the node gateways' certificate carries besides its Services' (a JSON list): every
     node the API server lists now (lookup; none under `helm template`) and
     tls.nodeGateway.nodeNames, each with "-<i>" for the i-th gateway of a node (perNode > 1),
     as each gateway names its node (FEDFAAS_GATEWAY_NODE). Discovery keeps a gateway only when
     its certificate names the node it claims, and every later call verifies that name
     (core/server_names.py). */}}
{{- define "fedfaas.gatewayNodeNames" -}}
{{- $nodes := list -}}
{{- range (lookup "v1" "Node" "" "").items -}}
{{- $nodes = append $nodes .metadata.name -}}
{{- end -}}
{{- $nodes = concat $nodes .Values.tls.nodeGateway.nodeNames | uniq -}}
{{- $names := list -}}
{{- range $node := $nodes -}}
{{- range $i := until (int $.Values.nodeGateway.perNode) -}}
{{- $names = append $names (ternary $node (printf "%s-%d" $node $i) (eq $i 0)) -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

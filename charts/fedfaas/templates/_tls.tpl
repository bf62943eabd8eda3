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

{{/* The Secret of one part. Call with (dict "ctx" $ "part" "node-gateway"). */}}
{{- define "fedfaas.tlsSecret" -}}
{{- printf "%s-%s" (include "fedfaas.tlsPrefix" .ctx) .part -}}
{{- end -}}

{{/* http or https: the scheme of the parts' own URLs. */}}
{{- define "fedfaas.scheme" -}}
{{- ternary "https" "http" .Values.tls.enabled -}}
{{- end -}}

{{/* The part's TLS settings (env). Call with (dict "prefix" "FEDFAAS_ENGINE_"
     "clientCerts" "required"). */}}
{{- define "fedfaas.tlsEnv" -}}
- name: {{ .prefix }}TLS_CERT_FILE
  value: /var/tls/tls.crt
- name: {{ .prefix }}TLS_KEY_FILE
  value: /var/tls/tls.key
- name: {{ .prefix }}TLS_CA_FILE
  value: /var/tls/ca.crt
- name: {{ .prefix }}TLS_CLIENT_CERTS
  value: {{ .clientCerts | quote }}
{{- end -}}

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

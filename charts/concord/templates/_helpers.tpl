{{/* Names, labels and the values every template shares. */}}

{{- define "concord.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "concord.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that gives every member its stable DNS name. */}}
{{- define "concord.headless" -}}
{{- printf "%s-headless" (include "concord.fullname" .) -}}
{{- end -}}

{{- define "concord.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "concord.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "concord.selectorLabels" -}}
app.kubernetes.io/name: {{ include "concord.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The members' pods (the jobs' pods carry other components). */}}
{{- define "concord.memberLabels" -}}
{{ include "concord.selectorLabels" . }}
app.kubernetes.io/component: member
{{- end -}}

{{- define "concord.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "concord.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "concord.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "concord.token" -}}
{{- default (printf "%s-%s" (include "concord.fullname" .) .Release.Namespace) .Values.initialClusterToken -}}
{{- end -}}

{{- define "concord.clientScheme" -}}
{{- if or .Values.tls.client.enabled .Values.tls.auto -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{- define "concord.peerScheme" -}}
{{- if or .Values.tls.peer.enabled .Values.tls.auto -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{- define "concord.clientSecret" -}}
{{- default (printf "%s-client-tls" (include "concord.fullname" .)) .Values.tls.client.existingSecret -}}
{{- end -}}

{{- define "concord.peerSecret" -}}
{{- default (printf "%s-peer-tls" (include "concord.fullname" .)) .Values.tls.peer.existingSecret -}}
{{- end -}}

{{- define "concord.authSecret" -}}
{{- default (printf "%s-auth" (include "concord.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* The members' DNS domain: <pod>.<this>. */}}
{{- define "concord.memberDomain" -}}
{{- printf "%s.%s.svc.%s" (include "concord.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/*
Environment shared by the members and the chart's jobs: where the members are, and etcdctl's
TLS and credentials (ETCDCTL_* variables).
*/}}
{{- define "concord.clientEnv" -}}
- name: CHART_BASE
  value: {{ include "concord.fullname" . | quote }}
- name: CHART_DOMAIN
  value: {{ include "concord.memberDomain" . | quote }}
- name: CHART_CLIENT_SCHEME
  value: {{ include "concord.clientScheme" . | quote }}
- name: CHART_PEER_SCHEME
  value: {{ include "concord.peerScheme" . | quote }}
- name: CHART_CLIENT_PORT
  value: {{ .Values.ports.client | quote }}
- name: CHART_PEER_PORT
  value: {{ .Values.ports.peer | quote }}
- name: ETCDCTL_API
  value: "3"
- name: ETCDCTL_DIAL_TIMEOUT
  value: "3s"
{{- if .Values.tls.client.enabled }}
- name: ETCDCTL_CACERT
  value: /etc/concord/client-tls/ca.crt
- name: ETCDCTL_CERT
  value: /etc/concord/client-tls/tls.crt
- name: ETCDCTL_KEY
  value: /etc/concord/client-tls/tls.key
{{- else if .Values.tls.auto }}
- name: ETCDCTL_INSECURE_SKIP_TLS_VERIFY
  value: "true"
{{- end }}
{{- if .Values.auth.enabled }}
- name: CHART_ROOT_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "concord.authSecret" . }}
      key: {{ .Values.auth.existingSecretKey }}
{{- end }}
{{- end -}}

{{/* The chart's scripts (files/*.sh) as ConfigMap data. */}}
{{- define "concord.scriptFiles" -}}
{{- range $path, $_ := .Files.Glob "files/*.sh" }}
{{ base $path }}: |
  {{- $.Files.Get $path | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Volumes the jobs need to reach the members: the scripts and the client certificate. */}}
{{- define "concord.clientVolumes" -}}
{{ include "concord.clientVolumesFrom" (list . (printf "%s-scripts" (include "concord.fullname" .))) }}
{{- end -}}

{{/* The same, with the scripts from ConfigMap (index . 1). */}}
{{- define "concord.clientVolumesFrom" -}}
{{- $ctx := index . 0 -}}
- name: scripts
  configMap:
    name: {{ index . 1 }}
    defaultMode: 0555
{{- if $ctx.Values.tls.client.enabled }}
- name: client-tls
  secret:
    secretName: {{ include "concord.clientSecret" $ctx }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "concord.clientVolumeMounts" -}}
- name: scripts
  mountPath: /opt/concord/chart
  readOnly: true
{{- if .Values.tls.client.enabled }}
- name: client-tls
  mountPath: /etc/concord/client-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* A job container's security context (the members' one). */}}
{{- define "concord.jobPod" -}}
serviceAccountName: {{ include "concord.serviceAccount" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

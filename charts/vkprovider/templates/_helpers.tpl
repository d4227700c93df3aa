{{/* Names and labels shared by the templates. */}}
{{- define "vkprovider.name" -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{- define "vkprovider.labels" -}}
app.kubernetes.io/name: vkprovider
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vkprovider.selector" -}}
app.kubernetes.io/name: vkprovider
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vkprovider.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding a member's kubeconfig, and its key. */}}
{{- define "vkprovider.memberSecret" -}}
{{- if .member.existingSecret -}}{{ .member.existingSecret.name }}{{- else -}}{{ include "vkprovider.name" .root }}-member-{{ .member.name }}{{- end -}}
{{- end -}}
{{- define "vkprovider.memberSecretKey" -}}
{{- if .member.existingSecret -}}{{ .member.existingSecret.key | default "kubeconfig" }}{{- else -}}kubeconfig{{- end -}}
{{- end -}}

{{/* Names and labels shared by the templates. */}}
{{- define "vkprovider.name" -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{/* Names of cluster-scoped objects (and of those in shared namespaces such as kube-node-lease):
the release name and its namespace, so releases of the same name in two namespaces share none. */}}
{{- define "vkprovider.clusterName" -}}
{{- printf "%s-%s" (include "vkprovider.name" .) .Release.Namespace -}}
{{- end -}}

{{- define "vkprovider.labels" -}}
app.kubernetes.io/name: vkprovider
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of a hook's or a test's pod: (list $ "drain"). Not the Deployment's selector: the
drain waits for the provider's pods to go, and must not wait for its own. */}}
{{- define "vkprovider.componentLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: vkprovider-{{ index . 1 }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/part-of: vkprovider
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
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

{{/* An exec probe of a path on the plain port's loopback address: (list $ "/healthz"). No answer
in 4 s, or a status of 400 or more, and python exits non-zero. http.client: no proxy, no TLS. */}}
{{- define "vkprovider.probe" -}}
{{- $root := index . 0 -}}
{{- $code := printf "import http.client as h; c = h.HTTPConnection('127.0.0.1', %v, timeout=4); c.request('GET', '%s'); raise SystemExit(c.getresponse().status >= 400)" $root.Values.ports.metrics (index . 1) -}}
[python, -I, -S, -c, {{ $code | quote }}]
{{- end -}}

{{/* Users' additions to the provider's container (and the drain's, which reads the same members
with the same kubeconfigs): environment, volumes and their mounts, e.g. a cloud CLI an exec
plugin runs, or a file a kubeconfig names (federation.secretFilePaths). */}}
{{- define "vkprovider.extraEnv" -}}
{{- with .Values.extraEnv }}
{{ toYaml . | indent 8 }}
{{- end }}
{{- end -}}
{{- define "vkprovider.extraVolumeMounts" -}}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . | indent 8 }}
{{- end }}
{{- end -}}
{{- define "vkprovider.extraVolumes" -}}
{{- with .Values.extraVolumes }}
{{ toYaml . | indent 6 }}
{{- end }}
{{- end -}}

{{/* The virtual nodes' names, space-separated: the pooled node, or one per member listed in
values (per-member; members added later as MemberCluster objects are not known here). */}}
{{- define "vkprovider.nodeNames" -}}
{{- if eq .Values.virtualNodes "pooled" -}}
{{ .Values.nodeName }}
{{- else -}}
{{- range $i, $m := .Values.members }}{{ if $i }} {{ end }}{{ $.Values.nodeName }}-{{ $m.name }}{{ end -}}
{{- end -}}
{{- end -}}

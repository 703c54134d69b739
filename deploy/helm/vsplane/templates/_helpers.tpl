{{/*
Labels of every object: the base's app.kubernetes.io/part-of and Helm's
own. Pod templates and selectors carry only app=..., as in deploy/base
(selectors cannot change after install).
*/}}
{{- define "vsplane.labels" -}}
app.kubernetes.io/part-of: vsplane
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* metadata.namespace and labels of a namespaced object. */}}
{{- define "vsplane.meta" -}}
namespace: {{ .Release.Namespace }}
labels:
  {{- include "vsplane.labels" . | nindent 2 }}
{{- end }}

{{/* An image reference: repository@digest, else repository:tag (tag "" = appVersion). */}}
{{- define "vsplane.image" -}}
{{- $img := index .root.Values.images .name -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The port of a host:port address (e.g. ":18000", "127.0.0.1:18001"). */}}
{{- define "vsplane.port" -}}
{{- regexReplaceAll "^.*:" . "" -}}
{{- end }}

{{/* The name in the control plane's certificate, which the agents verify. */}}
{{- define "vsplane.serverName" -}}
vsplane-controlplane.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The control plane's configuration file (vsplane.yaml). */}}
{{- define "vsplane.controlplaneConfig" -}}
apiVersion: config.vsplane.io/v1alpha1
kind: VsplaneConfiguration
{{ toYaml .Values.controlplane.config }}
{{- end }}

{{/* The agents' configuration file (agent.yaml); tls.serverName "" = the certificate's name. */}}
{{- define "vsplane.agentConfig" -}}
{{- $cfg := deepCopy .Values.agent.config -}}
{{- $_ := set $cfg.tls "serverName" ($cfg.tls.serverName | default (include "vsplane.serverName" .)) -}}
apiVersion: config.vsplane.io/v1alpha1
kind: VsplaneAgentConfiguration
{{ toYaml $cfg }}
{{- end }}

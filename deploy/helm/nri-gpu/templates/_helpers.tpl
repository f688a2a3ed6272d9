{{- define "nri-gpu.labels" -}}
app.kubernetes.io/name: nri-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nri-gpu.selector" -}}
app.kubernetes.io/name: nri-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* Whether device-plugin mode is on: resources in the configuration. */ -}}
{{- define "nri-gpu.devicePlugin" -}}
{{- if and .Values.config.devicePlugin .Values.config.devicePlugin.resources }}true{{ end }}
{{- end }}

{{- /* The pod's ServiceAccount: the chart's own, or serviceAccount.name. */ -}}
{{- define "nri-gpu.serviceAccount" -}}
{{- if .Values.serviceAccount.create }}{{ .Release.Name }}{{ else }}{{ .Values.serviceAccount.name | default "default" }}{{ end }}
{{- end }}

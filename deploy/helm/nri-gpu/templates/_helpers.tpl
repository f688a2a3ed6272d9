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

{{- /* Whether the DRA driver is on: config.dra.enabled. */ -}}
{{- define "nri-gpu.dra" -}}
{{- if and .Values.config.dra .Values.config.dra.enabled }}true{{ end }}
{{- end }}

{{- /* The DRA driver's name, kubelet's plugin and registry directories:
       config.dra's, or nri-gpu's defaults. */ -}}
{{- define "nri-gpu.draDriver" -}}
{{- (.Values.config.dra | default dict).driverName | default "gpu.nri-gpu.io" }}
{{- end }}
{{- define "nri-gpu.draPluginDir" -}}
{{- (.Values.config.dra | default dict).pluginDir | default "/var/lib/kubelet/plugins" }}
{{- end }}
{{- define "nri-gpu.draRegistryDir" -}}
{{- (.Values.config.dra | default dict).registryDir | default "/var/lib/kubelet/plugins_registry" }}
{{- end }}

{{/* "true" when config.mps is set or a policy.sharing entry shares with
     MPS (set config.mps to have the mount before sharing is turned on: a
     helm upgrade then reloads, never replaces, nri-gpu's pods). */}}
{{- define "nri-gpu.mps" -}}
{{- if .Values.config.mps }}true{{ else }}
{{- range ((.Values.config.policy | default dict).sharing | default list) }}{{ if eq (.strategy | default "") "mps" }}true{{ end }}{{ end }}
{{- end }}
{{- end }}

{{/* The MPS daemons' root directory. */}}
{{- define "nri-gpu.mpsRoot" -}}
{{- ((.Values.config.mps | default dict).root) | default "/run/nri-gpu/mps" }}
{{- end }}

{{/* Who runs the MPS control daemons: external or managed. */}}
{{- define "nri-gpu.mpsDaemon" -}}
{{- ((.Values.config.mps | default dict).daemon) | default "external" }}
{{- end }}

{{/* Where nri-gpu sees the host's root for its MPS daemons, or "". */}}
{{- define "nri-gpu.mpsHostRoot" -}}
{{- ((.Values.config.mps | default dict).hostRoot) | default "" }}
{{- end }}

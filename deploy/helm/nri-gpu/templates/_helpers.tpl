{{- define "nri-gpu.labels" -}}
app.kubernetes.io/name: nri-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nri-gpu.selector" -}}
app.kubernetes.io/name: nri-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* The settings nri-gpu reads at start: config.start in a configuration
       of version v1, config itself in one without version. */ -}}
{{- define "nri-gpu.start" -}}
{{- toYaml (.Values.config.start | default .Values.config) }}
{{- end }}

{{- /* Whether device-plugin mode is on: resources in the configuration. */ -}}
{{- define "nri-gpu.devicePlugin" -}}
{{- $dp := (include "nri-gpu.start" . | fromYaml).devicePlugin | default dict }}
{{- if $dp.resources }}true{{ end }}
{{- end }}

{{- /* Whether the device plugin's kubelet endpoint is kept by the relay
       container: the device plugin on, devicePluginRelay.enabled, and a
       cluster whose kubelets keep an endpoint per socket (1.36). */ -}}
{{- define "nri-gpu.relay" -}}
{{- if and (include "nri-gpu.devicePlugin" .) .Values.devicePluginRelay.enabled (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{- /* The directory where nri-gpu serves its device plugin to the relay:
       on the host, so that an nri-gpu taking over (a rolling update)
       serves at the path the relays of both pods ask. */ -}}
{{- define "nri-gpu.relayDir" -}}
{{ .Values.hostPaths.stateDir }}/device-plugin
{{- end }}

{{- /* Whether nri-gpu generates the NVIDIA spec: config.generate.enabled
       (config.generateSpecs without version). */ -}}
{{- define "nri-gpu.generate" -}}
{{- if or .Values.config.generateSpecs (.Values.config.generate | default dict).enabled }}true{{ end }}
{{- end }}

{{- /* The NVIDIA driver's root when it is not "/" (a containerized
       driver's, /run/nvidia/driver): mounted at its own path, so that the
       NVML nri-gpu loads and the files the specs it generates name are
       the host's. */ -}}
{{- define "nri-gpu.driverRoot" -}}
{{- $root := clean ((include "nri-gpu.start" . | fromYaml).driverRoot | default "/") }}
{{- if ne $root "/" }}{{ $root }}{{ end }}
{{- end }}

{{- /* The pod's ServiceAccount: the chart's own, or serviceAccount.name. */ -}}
{{- define "nri-gpu.serviceAccount" -}}
{{- if .Values.serviceAccount.create }}{{ .Release.Name }}{{ else }}{{ .Values.serviceAccount.name | default "default" }}{{ end }}
{{- end }}

{{- /* Whether the DRA driver is on: config.dra.enabled. */ -}}
{{- define "nri-gpu.dra" -}}
{{- if ((include "nri-gpu.start" . | fromYaml).dra | default dict).enabled }}true{{ end }}
{{- end }}

{{- /* The DRA driver's name, kubelet's plugin and registry directories:
       config.dra's, or nri-gpu's defaults. */ -}}
{{- define "nri-gpu.draDriver" -}}
{{- ((include "nri-gpu.start" . | fromYaml).dra | default dict).driverName | default "gpu.nri-gpu.io" }}
{{- end }}
{{- define "nri-gpu.draPluginDir" -}}
{{- ((include "nri-gpu.start" . | fromYaml).dra | default dict).pluginDir | default "/var/lib/kubelet/plugins" }}
{{- end }}
{{- define "nri-gpu.draRegistryDir" -}}
{{- ((include "nri-gpu.start" . | fromYaml).dra | default dict).registryDir | default "/var/lib/kubelet/plugins_registry" }}
{{- end }}

{{/* "true" when config.mps (config.start.mps in v1) is set or a policy.sharing entry shares with
     MPS (set config.mps to have the mount before sharing is turned on: a
     helm upgrade then reloads, never replaces, nri-gpu's pods). */}}
{{- define "nri-gpu.mps" -}}
{{- if (include "nri-gpu.start" . | fromYaml).mps }}true{{ else }}
{{- range ((.Values.config.policy | default dict).sharing | default list) }}{{ if eq (.strategy | default "") "mps" }}true{{ end }}{{ end }}
{{- end }}
{{- end }}

{{/* The MPS daemons' root directory. */}}
{{- define "nri-gpu.mpsRoot" -}}
{{- (((include "nri-gpu.start" . | fromYaml).mps | default dict).root) | default "/run/nri-gpu/mps" }}
{{- end }}

{{/* Who runs the MPS control daemons: external or managed. */}}
{{- define "nri-gpu.mpsDaemon" -}}
{{- (((include "nri-gpu.start" . | fromYaml).mps | default dict).daemon) | default "external" }}
{{- end }}

{{/* Where nri-gpu sees the host's root for its MPS daemons, or "". */}}
{{- define "nri-gpu.mpsHostRoot" -}}
{{- (((include "nri-gpu.start" . | fromYaml).mps | default dict).hostRoot) | default "" }}
{{- end }}

{{- /* Whether nri-gpu posts pod events: config.events.enabled. */ -}}
{{- define "nri-gpu.events" -}}
{{- $start := include "nri-gpu.start" . | fromYaml }}
{{- if hasKey $start "events" }}{{ if ($start.events | default dict).enabled }}true{{ end }}
{{- else if .Values.events.enabled }}true{{ end }}
{{- end }}

{{- /* Whether nri-gpu reaches the API server: DRA or events on. */ -}}
{{- define "nri-gpu.apiServer" -}}
{{- if or (include "nri-gpu.dra" .) (include "nri-gpu.events" .) }}true{{ end }}
{{- end }}

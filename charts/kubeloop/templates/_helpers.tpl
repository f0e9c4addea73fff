{{/* The release's name for every object; "kubeloop" alone when the release is called that. */}}
{{- define "kubeloop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubeloop.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kubeloop.labels" -}}
{{ include "kubeloop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The rules generated from kubeloop.operator.permissions (`make crds`). */}}
{{- define "kubeloop.rules" -}}
{{- .Files.Get "files/operator-rules.yaml" | fromYaml | toJson -}}
{{- end -}}

{{/* Rules granted where the custom resources live: namespaced ones, plus the Gateway's, KServe's and DRA's when used. */}}
{{- define "kubeloop.namespacedRules" -}}
{{- $rules := include "kubeloop.rules" . | fromJson -}}
{{- $namespaced := $rules.namespaced -}}
{{- if .Values.serving.gateway.name -}}
{{- $namespaced = concat $namespaced $rules.gateway -}}
{{- end -}}
{{- if eq .Values.serving.backend "kserve" -}}
{{- $namespaced = concat $namespaced $rules.kserve -}}
{{- end -}}
{{- if eq .Values.serving.gpuAllocation "dra" -}}
{{- $namespaced = concat $namespaced $rules.dra -}}
{{- end -}}
{{- if eq .Values.pipelines.backend "trainer" -}}
{{- $namespaced = concat $namespaced $rules.trainer -}}
{{- end -}}
{{- toYaml $namespaced -}}
{{- end -}}

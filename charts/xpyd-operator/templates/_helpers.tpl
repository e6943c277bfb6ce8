{{/* Names, labels and small decisions shared by every template of the chart. */}}

{{- define "xpyd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "xpyd.fullname" -}}
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

{{- define "xpyd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "xpyd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xpyd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "xpyd.labels" -}}
helm.sh/chart: {{ include "xpyd.chart" . }}
{{ include "xpyd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: xpyd
{{- end -}}

{{- define "xpyd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "xpyd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "xpyd.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) when the operator watches a single namespace. */}}
{{- define "xpyd.namespaced" -}}
{{- if .Values.operator.watchNamespace -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when the cluster serves the Prometheus Operator's API. */}}
{{- define "xpyd.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when a monitor renders: enabled true, or "auto" on a cluster with the
Prometheus Operator's API. Call with (dict "enabled" <value> "root" $). */}}
{{- define "xpyd.monitorOn" -}}
{{- $enabled := toString .enabled -}}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (include "xpyd.hasPrometheusOperator" .root)) -}}true{{- end -}}
{{- end -}}

{{- define "durable-mqtt.labels" -}}
app.kubernetes.io/part-of: durable-mqtt
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "durable-mqtt.operatorName" -}}
{{ .Release.Name | trunc 54 | trimSuffix "-" }}-operator
{{- end -}}

{{- define "durable-mqtt.serviceAccount" -}}
{{ .Values.operator.serviceAccount.name | default (include "durable-mqtt.operatorName" .) }}
{{- end -}}

{{- define "durable-mqtt.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

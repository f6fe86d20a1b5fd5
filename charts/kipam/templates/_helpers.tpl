{{/* Name of every object (and prefix of the others). */}}
{{- define "kipam.fullname" -}}
{{- required "fullnameOverride must be set" .Values.fullnameOverride -}}
{{- end -}}

{{- define "kipam.labels" -}}
app.kubernetes.io/name: kipam
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kipam.selectorLabels" -}}
app.kubernetes.io/name: kipam
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* kipam's user name: its own writes skip the webhook. */}}
{{- define "kipam.user" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kipam.fullname" .) -}}
{{- end -}}

{{/* "true" when kipam makes the webhook certificate itself. */}}
{{- define "kipam.selfSigned" -}}
{{- if and .Values.webhook.enabled (not .Values.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{- define "kipam.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "kipam.fullname" .)) .Values.webhook.selfSigned.secretName -}}
{{- end -}}

"""The kubeloop.dev/v1alpha1 API: typed models that are the one source of truth
for the CRDs, the operator's parsing and the status it writes."""

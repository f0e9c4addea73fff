//go:build tools

// Pins prometheus-adapter's server so `go build sigs.k8s.io/prometheus-adapter/cmd/adapter`
// resolves at the version tools/versions.env names (its go.mod carries no replace
// lines, so the versions its own go.sum pins are the ones built here). The
// platform runs it as the custom metrics API (`kubeloop dev metrics-adapter`).
package tools

import _ "sigs.k8s.io/prometheus-adapter/cmd/adapter"

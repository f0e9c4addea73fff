//go:build tools

// Pins Kubeflow Trainer's controller manager and the JobSet controller its
// manifests install beside it (Trainer v2.3.0 requires JobSet v0.12.0's API,
// so both build from one module graph).
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)

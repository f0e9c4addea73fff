//go:build tools

// Pins KServe's controller manager so `go build github.com/kserve/kserve/cmd/manager`
// resolves with the replace lines KServe's own go.mod carries (a dependency's
// replaces do not apply to the module that requires it).
package tools

import _ "github.com/kserve/kserve/cmd/manager"

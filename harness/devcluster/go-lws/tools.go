//go:build tools

// Package lws pins the LeaderWorkerSet controller (sigs.k8s.io/lws) in a module of its own, so its
// dependencies never move the control plane's (../go).
package lws

import (
	_ "sigs.k8s.io/lws/cmd"
)

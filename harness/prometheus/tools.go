//go:build tools

// Package tools pins the Prometheus server and promtool that the observability tests build
// (harness/prometheus/build.py); nothing here is compiled into the project.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)

// Command dashboardcheck fails on a Grafana dashboard (JSON, each file named) that Grafana's own
// dashboard schema does not allow: unknown, missing or mistyped fields, and panel options or
// Prometheus queries of the wrong shape. The checking is the strict decoding and validation of
// the schema-generated types of github.com/grafana/grafana-foundation-sdk; this is only its
// command line, for the chart's tests (vkprovider's own code is Python; this module is the
// lab's tool, like the others under e2e/tools).
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// failed is err unless it is an empty list of build errors, which the strict decoding returns
// (as a non-nil error) when it found nothing wrong.
func failed(err error) error {
	var errs cog.BuildErrors
	if errors.As(err, &errs) && len(errs) == 0 {
		return nil
	}
	return err
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var board dashboard.Dashboard
	if err := failed(board.UnmarshalJSONStrict(raw)); err != nil {
		return err
	}
	return failed(board.Validate())
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboardcheck DASHBOARD.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins() // panel options and data queries decoded by their own schemas
	bad := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			bad = true
		}
	}
	if bad {
		os.Exit(1)
	}
}

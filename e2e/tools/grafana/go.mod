module vkprovider.local/e2e/tools/grafana

go 1.26.7

require github.com/grafana/grafana-foundation-sdk/go v0.0.22

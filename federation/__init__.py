"""federation: the provider that pools member clusters behind virtual nodes.

Organised by concern, one package each, layered (pyproject.toml's import-linter contracts):

    provider, cli                    compose the features for the runtime; `federation agent`
    dispatch | reclaim | tenancy     the features: independent of each other; what one needs
    | streams | view | agent         of another is a Protocol it declares, wired by the provider
    members                          member clusters as held: connection, watches, our pods, outages
    config                           settings of the provider and of each member
    capacity | jobs | podsecurity    pure: what members lend; what a job is; pod security levels
    labels | bands                   pure: our labels and annotations; priority bands

Modules named pure in their package's docstring do no I/O (a contract checks their imports).
"""

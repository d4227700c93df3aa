"""What people read of the provider: a reader of its state, never part of it.

- history (pure): capacity over time in bounded ring buffers at a few resolutions;
- tide: the history fed from the member summaries, lent and used core- and GPU-seconds, and
  the gauges of the present moment (Prometheus collectors);
- reclaims (pure): every pod given back, with its cause and notice, in a bounded log;
- page: the dashboard, one self-contained page (dashboard/index.html);
- grafana (pure): the Grafana dashboard the chart ships, generated;
- forecast (pure): the tide ahead per member, and its error on the history kept;
- store: the history and the reclaims kept across restarts, in one file;
- readings: what the provider serves of all this (a mixin of FederationProvider).

May import: federation.capacity and the shared modules. Must not import: members,
dispatch, reclaim, tenancy, streams or agent; what it shows of them is handed in as callables.
"""

"""Giving capacity back to online load: by band, whole machines first, after a checkpoint
notice, and the jobs told.

Pure: planner (which of our pods go, and why). I/O: reclaimer (the rounds: plan, confirm,
notice, delete, withdraw), notices (the writes on both sides of a victim, and deadlines),
reports (PodsReclaimed and last-reclaim for the jobs), metrics, drain (`vkprovider drain`:
this provider out of every member before it is uninstalled).

May import: federation.members, federation.config, federation.capacity and the shared modules.
Must not import: dispatch, tenancy, streams, view or agent.
"""

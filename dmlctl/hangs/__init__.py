"""Hang detection, the control plane's room beside ``launch``: the rules that name a
hung rank from what the controller knows of every rank (:mod:`dmlctl.hangs.rules`),
and the watch that feeds them each rank's heartbeats and process samples and reports a
verdict once it holds (:mod:`dmlctl.hangs.watch`). The attempt acts on a verdict (stack
dumps, then the restart policy)."""

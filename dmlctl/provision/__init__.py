"""Everything done to hosts around a run, all hosts in parallel, every failure kept.

* :mod:`dmlctl.provision.doctor` — the preflight checks (scripts in
  :mod:`dmlctl.provision.probe`, required packages in
  :mod:`dmlctl.provision.requirements`);
* :mod:`dmlctl.provision.ship` — code sync (over :mod:`dmlctl.provision.sync`) and
  the job's setup command;
* :mod:`dmlctl.provision.ports` — rendezvous ports and host probes;
* :mod:`dmlctl.provision.agents` — agents an earlier controller left running;
* :mod:`dmlctl.provision.replicate` — checkpoint copies between hosts during a run;
* :mod:`dmlctl.provision.collect` — rank files collected after a run.
"""

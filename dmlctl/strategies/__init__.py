"""Training strategies, one small package each, registered by name in
:mod:`dmlctl.strategies.registry`.

A strategy's ``params`` module is torch-free (what the control plane imports); its
``strategy`` module holds the torch code the hosts run. :mod:`.params` holds what every
parameter model shares, :mod:`.common` the tensor helpers several strategies use,
:mod:`.topology` the gossip graphs (pure Python).
"""

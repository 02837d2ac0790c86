"""What the training libraries people already use log, sent to dmlctl's dashboard,
``dmlctl status`` and ``dmlctl plot``: a Hugging Face ``TrainerCallback``
(:mod:`dmlctl.integrations.transformers`), a Lightning logger
(:mod:`dmlctl.integrations.lightning`) and an accelerate tracker
(:mod:`dmlctl.integrations.accelerate`). Each is an optional extra
(``pip install 'dmlctl[hf]'``, ``'dmlctl[lightning]'``, ``'dmlctl[accelerate]'``) and
does nothing outside a dmlctl run.
"""

"""Glue for training frameworks that need more than the loader's ``state_dict`` / ``load_state_dict``.

Lightning, accelerate and ``torch.distributed.checkpoint`` take the loader as it is (see the
"Training frameworks" page of the documentation). The Hugging Face ``Trainer`` needs a callback:
:class:`guideloom.integrations.transformers.LoaderStateCallback`. Each submodule imports its
framework, so import only the one you use.
"""

"""Horovod's PyTorch API on torch.distributed: the library the horovod strategy and
the user-facing ``raylight.horovod`` both use.
"""

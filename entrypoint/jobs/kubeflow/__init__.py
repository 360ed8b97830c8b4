"""Kubeflow: the PyTorchJob / TFJob (``job.py``) and TrainJob (``trainjob.py``), their pods (``pods.py``, ``roles.py``,
``volumes.py``, ``fabricpods.py``) and placement (``placement.py``)."""

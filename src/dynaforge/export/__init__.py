"""ONNX export and use of trained models.

- `onnx_export.py` (needs PyTorch): `export_run` writes a run's model as ONNX and verifies it in
  onnxruntime against PyTorch.
- `onnx_rollout.py` (onnxruntime, numpy and h5py only): `rollout_onnx` rolls an exported surrogate out
  on a dataset folder, without PyTorch.
- `onnx_file.py` (onnx only): what a path named as a model holds; `export` replaces only its own exports.

Nothing is imported here, so that importing `dynaforge.export.onnx_rollout` does not load PyTorch.
"""

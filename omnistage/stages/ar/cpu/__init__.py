"""The AR engine's CPU fast path, behind one switch (`engine_args.cpu_fast_path`, default on): linears on
prepacked oneDNN weights (packed_linear.py), the decoder stack without transformers' per-call machinery for
the layer forms families register (lean_decoder.py, layer_forms.py), and native decode-attention and
pointwise kernels built at install (native.py, csrc/). Off, the engine runs the model's own forward on
plain torch ops; the plain path is tested too."""

"""Each rank's entry (torch.distributed.run runs this file): Megatron-LM 0.19's pretrain_gpt.py from this
folder, as its own ``__main__``, on the megatron-core wheel.

One change to what the wheel does, made here and nowhere in the vendored files: rank 0's
megatron.training.initialize._compile_dependencies runs ``make`` in megatron/core/datasets, whose Makefile the
wheel does not carry, so it fails and exits before the model is built. The wheel carries the prebuilt
extension ``helpers_cpp`` that make would build: when it imports, compile_helpers skips the make (and says so);
when it does not, Megatron's own compile_helpers runs as before.
"""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _skip_make_when_prebuilt() -> None:
    from megatron.core.datasets import utils

    make = utils.compile_helpers

    def compile_helpers():
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401
        except ImportError:
            return make()
        print("> tptune: megatron.core.datasets.helpers_cpp imports (the wheel's prebuilt build): no make",
              flush=True)

    utils.compile_helpers = compile_helpers


if __name__ == "__main__":
    sys.path.insert(0, HERE)              # pretrain_gpt imports gpt_builders and model_provider beside it
    _skip_make_when_prebuilt()
    sys.argv[0] = os.path.join(HERE, "pretrain_gpt.py")
    runpy.run_path(sys.argv[0], run_name="__main__")

"""Reading checkpoints and writing lowbit model directories.

    from lowbit.io import open_checkpoint, convert
    ckpt = open_checkpoint(path)          # HF folder | .gguf | lowbit dir -> Checkpoint (HF names + config)
    ckpt.load("model.norm.weight")        # float32 array, or a PackedWeight for packed / ternary sources
    tok = ckpt.tokenizer()                # Tokenizer: encode / decode / apply_chat_template / eos_ids
    convert(path, "out-dir", format="int4")
"""
from lowbit.io.checkpoint import Checkpoint, open_checkpoint
from lowbit.io.convert import convert
from lowbit.io.modeldir import LowbitCheckpoint, ModelDirWriter, OutputExistsError
from lowbit.io.tokenizer import Tokenizer

__all__ = ["Checkpoint", "LowbitCheckpoint", "ModelDirWriter", "OutputExistsError", "Tokenizer", "convert",
           "open_checkpoint"]

"""The library of contrastive pretraining: methods, the models they train, their configuration,
cached-gradient accumulation and the optimizer, with no training loop in it.

Each method is a :class:`Method` object registered by name (:func:`register_method`,
:func:`get_method`); it owns its facts (default temperature, paired data, micro-batches) and its
own configuration options. :class:`PretrainConfig` is a run's configuration; :func:`load_data`
and :func:`build_model` build a run's data set and model from it; :func:`cached_gradient_loss`
takes a batch larger than the encoder's activations fit, exactly, in micro-batches, in any
training loop; :func:`build_optimizer` and :func:`build_lr_scheduler` are a run's optimizer and
learning-rate schedule; :class:`StepPrecision` is a training step's arithmetic (float32, or
autocast to bfloat16 / float16 with a gradient scaler) and :func:`channels_last_batch` its
images' memory format. :func:`before_loss`, :func:`step_loss` and :func:`after_optimizer_step`
(:mod:`.step`) are one training step, the same in every loop. The trainer (:mod:`contrastkit.train`) and the Lightning integration
(:mod:`contrastkit.integrations.lightning`) build on this package; it imports neither.

Adding a method is one subclass, registered::

    from contrastkit import losses
    from contrastkit.methods import TwoViewMethod, register_method

    @register_method
    class Alignment(TwoViewMethod):
        name = "align"
        default_temperature = 0.5
        def objective(self, model, embeddings, labels):
            return losses.nt_xent_views(*embeddings, temperature=model.temperature)
"""

from .accumulation import average_gradients, cached_gradient_loss
from .base import Batch, EvalContext, Method, across_ranks
from .build import build_model, limit_data, load_data, method_data
from .config import OPTIMIZERS, RESUME_MAY_CHANGE, DataChoices, PretrainConfig, default_batch_size, resolve_for_data
from .convirt import Convirt, ConvirtModel
from .moco import MoCo
from .optimization import build_lr_scheduler, build_optimizer, warmup_cosine
from .precision import StepPrecision, channels_last_batch, check_precision
from .registry import METHOD_REGISTRY, get_method, method_names, register_method, unregister_method
from .siglip import Siglip, SiglipModel
from .step import after_optimizer_step, before_loss, keeps_sample_state, step_loss
from .tap import BatchTap, observe_batch
from .two_view import DCL, ContrastiveModel, HardNegative, Simple, SimCLR, SupCon, TwoViewMethod

# The built-in methods, in the order the CLI lists them.
for _method in (SimCLR, MoCo, SupCon, DCL, Simple, HardNegative, Convirt, Siglip):
    register_method(_method)
del _method

__all__ = ["Method", "TwoViewMethod", "EvalContext", "Batch", "across_ranks", "METHOD_REGISTRY", "register_method",
           "unregister_method", "get_method", "method_names", "PretrainConfig", "DataChoices", "resolve_for_data",
           "default_batch_size", "OPTIMIZERS", "RESUME_MAY_CHANGE", "load_data", "method_data", "limit_data", "build_model",
           "ContrastiveModel", "ConvirtModel", "SiglipModel", "SimCLR",
           "MoCo", "SupCon", "DCL", "Simple", "HardNegative", "Convirt", "Siglip", "cached_gradient_loss",
           "average_gradients", "build_optimizer", "build_lr_scheduler", "warmup_cosine", "BatchTap", "observe_batch",
           "StepPrecision", "channels_last_batch", "check_precision", "before_loss", "step_loss",
           "after_optimizer_step", "keeps_sample_state"]

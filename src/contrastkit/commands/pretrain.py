"""``contrastkit pretrain``: contrastive pretraining judged by a frozen linear probe."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import fields
from typing import Any, Dict, List, Optional

from contrastkit import layout
from contrastkit.commands.common import add_collection_changed_argument, add_config_argument, parse_data_options, parse_names, print_result_table
from contrastkit.data.collection import MAX_SIZE, check_image_size
from contrastkit.methods import METHOD_REGISTRY, OPTIMIZERS, PretrainConfig, method_names
from contrastkit.methods.config import (DATA_ON_DEVICE, LOGGER_NAMES, ON_NAN, OPTION_GROUPS, PRECISIONS, SELECT_BY,
                                        option_facts)
from contrastkit.models import ENCODERS
from contrastkit.temperature_methods import TEMPERATURE_METHOD_REGISTRY
from contrastkit.models.text import TEXT_ENCODERS

# Config-file keys that are PretrainConfig field names rather than option names (OUT/config.yaml
# holds the fields): every field of PretrainConfig is a key of `pretrain --config`.
_CONFIG_ALIASES = {"data_options": "data_option", "loggers": "logger", "encoder_options": "encoder_option"}
# The options that map one-to-one onto PretrainConfig fields (argparse dest = field name).
_FIELDS = tuple(f.name for f in fields(PretrainConfig) if f.name not in _CONFIG_ALIASES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = PretrainConfig()
    parser.description = (
        "Train an encoder with a contrastive loss on two views of each image, then judge it by the "
        "fixed read-out protocol (frozen encoder -> linear probe with C chosen on val, and weighted "
        "kNN) next to two baselines: the same network at random init and raw pixels. Writes "
        "OUT/config.json, OUT/config.yaml (pass it back with --config to rerun), OUT/metrics.jsonl, "
        "OUT/checkpoints/last.pt and OUT/summary.json.")
    # Every default is None so that --resume can tell given options from defaults.
    add = _grouped(parser)
    add("--data", default=None, help=f"glyphlab, digits, or a path (image folder, MNIST idx, CIFAR-10 "
                                     f"batches, .npz, tar shards: a folder, brace pattern or .txt list of "
                                     f"them); for the image-text methods (convirt, siglip): glyphlab-text, "
                                     f"digits-text, a .csv of image,text rows or tar shards with .txt "
                                     f"captions; or what an installed data source (entry point group "
                                     f"contrastkit.data_sources) names (default {d.data})")
    add("--data-option", action="append", default=None, metavar="KEY=VALUE",
        help="loader option, repeatable, e.g. train_scenes=480 for glyphlab (VALUE parsed as JSON if it can be)")
    add("--unlabeled", action="store_true", default=None,
        help="read --data as an unlabeled image collection even if it has class subfolders (a flat or nested "
             "folder without class structure, or a .txt/.csv list of image paths, is one anyway)")
    add("--bad-files", choices=("skip", "fail"), default=None,
        help="unlabeled collections: a damaged image file is skipped and named in OUT/skipped.txt (skip, the "
             "default) or stops the run (fail)")
    add("--image-size", type=int, default=None, metavar="S",
        help=f"unlabeled collections: images are resized (shorter side to S) and centre-cropped to SxS (default 32, "
             f"at most {MAX_SIZE}); the data option size=S")
    add("--eval-data", default=None, metavar="DATA",
        help="a labelled data set (class folders, ...) on which the encoder trained on unlabeled --data is judged "
             "by the linear probe and kNN, next to the label-free read-out; or, for labelled tar shards, held-out "
             "shards that val and test come from (every --data sample then trains)")
    add("--train-limit", type=int, default=None, metavar="N",
        help="train on a class-stratified subset of N training images (default: all)")
    add("--val-limit", type=int, default=None, metavar="N", help="a stratified subset of N val images (default: all)")
    add("--test-limit", type=int, default=None, metavar="N", help="a stratified subset of N test images (default: all)")
    add("--subset-seed", type=int, default=None, help="seed of the subsets, the same for every --seed (default 0)")
    add("--method", choices=method_names(), default=None, help=f"(default {d.method})")
    add("--encoder", default=None, metavar="NAME",
        help=f"a built-in ({', '.join(ENCODERS)}: plain torch; resnet18/resnet50 want a GPU, vit is for 32x32 "
             f"images), timm:NAME (timm.create_model(NAME, num_classes=0); needs contrastkit[timm]), "
             f"torchvision:NAME (its classification layer removed; needs contrastkit[torchvision]) or "
             f"package.module:factory, a callable returning any nn.Module from images (N, C, H, W) to (N, D) "
             f"or (N, D, ...) (default {d.encoder})")
    add("--encoder-option", action="append", default=None, metavar="KEY=VALUE",
        help="keyword argument of the encoder's factory or model, repeatable, e.g. width=32 or drop_path_rate=0.1 "
             "(VALUE parsed as JSON if it can be); cifar_stem=true gives a timm or torchvision ResNet the 32x32 "
             "stem (3x3 conv, stride 1, no max-pool); recorded with the run, so probe rebuilds the encoder "
             "without them")
    add("--encoder-weights", default=None, metavar="FILE",
        help="start the encoder from local weights: a state dict saved by torch.save (.pt/.pth, possibly under "
             "'state_dict' or 'model') or a .safetensors file; missing and unexpected keys are reported, a "
             "shape mismatch is refused naming the key")
    add("--views", choices=("augment", "A", "B", "paired"), default=None,
        help="augment: two SimCLR augmentations; A/B: glyphlab noise-realisation pairs (B rotates one "
             f"view by 90 degrees); paired: convirt's image-text pairs (default {d.views})")
    add("--view-strength", type=float, default=None, help="augmentation strength in [0, 2] (default 1 for "
                                                          "augment, 0 for A/B)")
    add("--temperature", type=float, default=None,
        help="initial tau (default per method: " + ", ".join(f"{name} {method.default_temperature}"
                                                              for name, method in METHOD_REGISTRY.items()) + ")")
    add("--learnable-temperature", action="store_true", default=None, help="train tau (CLIP parameterisation)")
    add("--temperature-schedule", default=None, metavar="SCHEDULE",
        help="how tau changes over the run: constant, cosine:MIN,MAX[,PERIOD], kukleva[:MIN,MAX[,T_EPOCHS]], "
             "linear:START,END, step:V1,V2,...[@F1,...], learnable[:INIT] (default constant; siglip: "
             "learnable, constant fixes its tau)")
    add("--temperature-method", default=None, metavar="METHOD",
        help="a loss that decides its own temperatures, in place of simclr's NT-Xent at one tau: "
             + "; ".join(spec.form for spec in TEMPERATURE_METHOD_REGISTRY.values())
             + " (see docs/temperature-methods.md)")
    add("--epochs", type=int, default=None, help=f"(default {d.epochs})")
    add("--batch-size", type=int, default=None,
        help="source images per step (default: sized to the training set and printed at the start: 60 up to "
             "2,047 images, then one per 32 images, 256 from 8,192 on; recorded in OUT/config.json)")
    add("--optimizer", choices=OPTIMIZERS, default=None, help=f"(default {d.optimizer})")
    add("--lr", type=float, default=None, help="peak learning rate (default adamw 2e-3, sgd 0.1)")
    add("--weight-decay", type=float, default=None, help="(default adamw 1e-4, sgd 5e-4)")
    add("--warmup-fraction", type=float, default=None,
        help=f"share of steps in linear warm-up before the cosine decay (default {d.warmup_fraction})")
    add("--momentum", type=float, default=None, help=f"moco key-encoder momentum (default {d.momentum})")
    add("--queue-size", type=int, default=None,
        help="moco queue length, a multiple of the batch size (default: up to 16 batches, < train size)")
    add("--projection-dim", type=int, default=None, help="size of z (default 64; convirt 512)")
    add("--weight", type=float, default=None,
        help="convirt: lambda on the image->text InfoNCE, 1 - lambda on text->image (default 0.75)")
    add("--text-encoder", choices=TEXT_ENCODERS, default=None,
        help="convirt: text encoder, mean-pooled word embeddings or a 2-layer transformer (default mean)")
    add("--micro-batch", type=int, default=None, metavar="M",
        help="cached-gradient accumulation: embed the batch in micro-batches of M source images (M divides "
             "the batch, per process under torchrun), the loss still on the whole batch; the gradients are "
             "the full batch's without batch statistics (--norm group); see docs/accumulation.md")
    add("--norm", choices=("batch", "group"), default=None,
        help="the encoder's and head's normalisation: BatchNorm, or GroupNorm/LayerNorm, which have no "
             "batch statistics (default batch)")
    add("--seed", type=int, default=None, help=f"(default {d.seed})")
    add("--device", default=None, help="auto, cpu, cuda, cuda:1, ... (default auto)")
    add("--threads", type=int, default=None,
        help="CPU threads (default 0: the cores this process may use); on a CPU shared with other jobs "
             "use --threads 1, or set OMP_WAIT_POLICY=PASSIVE so idle OpenMP threads do not spin")
    add("--workers", type=int, default=None,
        help="DataLoader worker processes decoding images; an image folder with --workers > 0 (or "
             "--data-option stream=true) is streamed, only its file index held in memory (default 0)")
    add("--compile", action="store_true", default=None,
        help="torch.compile the encoder for the training steps (inductor, on CPU and CUDA; needs a C++ compiler); "
             "the first step pays the compilation; the losses equal the eager run's within float rounding "
             "(speed on this machine: benchmarks/results/compile.md)")
    add("--precision", choices=PRECISIONS, default=None,
        help="the training step's arithmetic: 32 (float32), bf16 (autocast to bfloat16) or fp16 (autocast to float16 "
             "with a gradient scaler); the losses keep their log-sum-exp in float32, the read-out runs in float32 "
             f"(default {d.precision}; see docs/pretrain.md, GPU training)")
    add("--channels-last", action="store_true", default=None,
        help="the model's weights and the input images in the channels-last memory format (faster convolutions "
             "with bf16/fp16 on recent GPUs)")
    add("--data-on-device", choices=DATA_ON_DEVICE, default=None,
        help="hold the whole training split (uint8 where it is lossless) on the training device and make the views "
             "there, so a step copies no images: auto (on a GPU, when it takes at most a quarter of the free "
             f"memory), on, off; the run prints which and why (default {d.data_on_device})")
    add("--baseline-cache", default=None, metavar="DIR",
        help="where the baselines' read-out numbers are kept, so a data set's raw-pixel baseline (and a seed's "
             "random-init one) is computed once, not in every run: auto ($CONTRASTKIT_CACHE, else "
             "$XDG_CACHE_HOME/contrastkit or ~/.cache/contrastkit), off, or a folder (default auto)")
    add("--log-every", type=int, default=None, help=f"steps between metrics records (default {d.log_every})")
    add("--eval-every", type=int, default=None,
        help="epochs between val read-outs (kNN and linear probe, logged to metrics.jsonl; with --select-by "
             "online_... the online numbers of those epochs instead); the "
             "epoch with the best --select-by score is reported as summary.json's selected block (default 0: "
             "never)")
    add("--select-by", choices=SELECT_BY, default=None,
        help="the score that picks the reported epoch among the --eval-every epochs: val_probe refits a linear "
             "probe on the training features at each of them; online_probe, online_knn (labelled data) and "
             "online_view_retrieval (images without labels) take the number the online read-out measured at "
             "that epoch's end, and the val probe is not refitted (default val_probe)")
    add("--checkpoint-every", type=int, default=None, metavar="N",
        help="also write the checkpoint every N steps, not only at the end of each epoch (for long epochs; "
             "default 0: epoch ends only). On SIGTERM or SIGUSR1 a run always checkpoints the step it is in "
             "and exits with status 75; --resume continues it")
    add("--on-nan", choices=ON_NAN, default=None,
        help="a non-finite training loss: stop the run naming the step and the last good checkpoint (stop), or "
             "drop that step's update and count it in summary.json's skipped_steps (skip) (default stop)")
    add("--online-probe", action=argparse.BooleanOptionalAction, default=None,
        help="log every epoch an online read-out: on labelled data the val accuracy of a linear probe trained "
             "beside the encoder on its detached features (the steps' own forward pass, its own optimizer) and of "
             "a kNN on a fixed sample of training features (metrics.jsonl's online_probe_accuracy, "
             "online_knn_accuracy); on images without labels the view retrieval of 2,000 val images "
             "(online_view_retrieval_top1); the encoder trains the same without it (default on; its cost, about 1 "
             "in 100 of a step and 3 in 100 of an epoch for the evaluation, is in "
             "benchmarks/results/online_probe.md)")
    add("--knn-k", type=int, default=None, help=f"neighbors of the kNN read-out (default {d.knn_k})")
    add("--knn-temperature", type=float, default=None,
        help=f"temperature of the weighted kNN read-out (default {d.knn_temperature})")
    add("--logger", default=None, metavar="NAMES",
        help="also log to: csv (OUT/metrics.csv), tensorboard (OUT/tensorboard/, needs the tensorboard "
             "package), comma-separated (default: metrics.jsonl only)")
    add("--out", default=None, help=f"output folder (default {d.out})")
    add("--resume", action="store_true", help="continue the run in OUT from its last checkpoint (options not "
                                              "given are taken from OUT/config.json)")
    add("--force", action="store_true", help="start over in a non-empty OUT (deletes its run files)")
    add_collection_changed_argument(add, "--resume")
    add("--quiet", action="store_true", help="no progress bar")
    add("--json", action="store_true", help="print summary.json instead of the table")
    add("--no-report", action="store_true", help="do not write OUT/report.html (see: contrastkit report --help)")
    add("--no-baselines", action="store_true",
        help="skip the random-init and raw-pixel read-outs (summary.json then has only the trained encoder's); "
             "the raw-pixel baseline holds N x C*H*W float32 features per split, which is what makes the "
             "read-out's memory grow with a large streamed data set")
    add_config_argument(parser, aliases=_CONFIG_ALIASES)


#: The options of this command that are not a run's configuration.
_COMMAND_GROUP = ("command", "what this command does with OUT and what it prints")
#: Options that set a field through another (``--image-size S``: the data option ``size``).
_OPTION_GROUP = {"image_size": "data"}


def _field_of(dest: str) -> str:
    """The :class:`PretrainConfig` field an option's ``dest`` sets (its name, or an alias's)."""
    return {option: name for name, option in _CONFIG_ALIASES.items()}.get(dest, dest)


def _grouped(parser: argparse.ArgumentParser) -> Any:
    """``add(*flags, **options)`` that puts each option in the argument group of the field it
    sets (:data:`~contrastkit.methods.config.OPTION_GROUPS`, the fields' metadata), and the
    command's own options last."""
    groups = {name: parser.add_argument_group(f"{name} options", description)
              for name, description in OPTION_GROUPS.items()}
    command = parser.add_argument_group(f"{_COMMAND_GROUP[0]} options", _COMMAND_GROUP[1])
    facts = option_facts()

    def add(*flags: str, **options: Any) -> argparse.Action:
        dest = options.get("dest") or flags[0].lstrip("-").replace("-", "_")
        name = _field_of(dest)
        group = groups[facts[name]["group"] if name in facts else _OPTION_GROUP[name]] \
            if name in facts or name in _OPTION_GROUP else command
        return group.add_argument(*flags, **options)

    return add


def option_table() -> str:
    """The options of ``contrastkit pretrain`` as docs/pretrain.md's table (Markdown), group by
    group in the order of ``--help``: each option, whether a resumed run may change it, and its
    help; made from the parser and the fields' metadata, so the docs cannot drift from them."""
    parser = argparse.ArgumentParser(prog="contrastkit pretrain")
    add_arguments(parser)
    facts = option_facts()
    lines = []
    for group in parser._action_groups:
        actions = [action for action in group._group_actions if action.option_strings and action.dest != "help"]
        if not actions or group.title in ("options", "optional arguments"):
            continue
        lines += [f"**{group.title}**: {group.description}", "",
                  "| option | may change on `--resume` | what it sets |", "|---|:---:|---|"]
        for action in actions:
            name = _field_of(action.dest)
            configured = name in facts or name in _OPTION_GROUP
            resume = ("yes" if facts.get(name, {}).get("resume") else "no") if configured else ""
            flag = action.option_strings[-1] + (f" {action.metavar}" if action.metavar else "")
            if isinstance(action, argparse.BooleanOptionalAction):  # --name and --no-name
                flag = f"--[no-]{action.option_strings[0][2:]}"
            text = " ".join((action.help or "").split()).replace("|", "\\|")
            lines.append(f"| `{flag}` | {resume} | {text} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """The run's configuration: explicit options over (with --resume) the stored run's ones
    over the defaults."""
    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name, None) is not None}
    if args.data_option is not None:
        given["data_options"] = parse_data_options(args.data_option)
    if args.image_size is not None:
        given["data_options"] = {**given.get("data_options", {}),
                                 "size": check_image_size(args.image_size, "--image-size")}
    loggers = parse_names(args.logger, "--logger", LOGGER_NAMES)
    if loggers is not None:
        given["loggers"] = loggers
    if args.encoder_option is not None:
        given["encoder_options"] = parse_data_options(args.encoder_option, option="--encoder-option")
    base = PretrainConfig().to_dict()
    if args.resume:
        out = given.get("out", base["out"])
        if os.path.isfile(layout.RunFolder(out).config):
            from contrastkit.train.runs import read_run_config

            base.update(read_run_config(out).to_dict())
    base.update(given)
    return PretrainConfig.from_dict(base)


def run(args: argparse.Namespace) -> int:
    from contrastkit.train import pretrain

    config = config_from_args(args)
    reported: List[Optional[str]] = []

    def report(summary: Dict[str, Any]) -> None:
        """The run's table, and its report written while the run still holds the folder."""
        if args.json:
            print(json.dumps(summary, indent=2, sort_keys=True))
        else:
            print_result_table(summary, f"{summary['method']} on {summary['data']} ({summary['encoder']} encoder, "
                                 f"{summary['epochs']} epochs) -> {config.out}")
        if not args.no_report:
            from contrastkit.report import report_after_run

            reported.append(report_after_run(config.out))  # a failure is a warning: the results are on disk

    summary = pretrain(config, resume=args.resume, force=args.force, progress=False if args.quiet else None,
                       baselines=not args.no_baselines, on_summary=report, collection_changed=args.collection_changed)
    if summary is None:  # a rank > 0 under torchrun: rank 0 reports
        return 0
    if reported and reported[0] is not None and not args.json:
        print(f"report: {reported[0]}")
    return 0

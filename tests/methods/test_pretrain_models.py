"""Encoders, projection head and the per-method loss wiring of ContrastiveModel."""

import copy

import pytest
import torch
import torch.nn.functional as F

from contrastkit import losses
from contrastkit.models import ProjectionHead, ResNet18, SmallCNN, build_encoder
from contrastkit.train import ContrastiveModel
from contrastkit.train.setup import limit_threads


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny problems: extra threads only add synchronisation cost on a shared CPU.
    with limit_threads(1):
        yield


def test_small_cnn_shapes_and_channels():
    torch.manual_seed(0)
    for channels, size in ((1, 28), (3, 32), (1, 8)):
        encoder = SmallCNN(channels)
        assert encoder(torch.rand(5, channels, size, size)).shape == (5, encoder.out_dim)
    assert SmallCNN(1, width=8).out_dim == 64


def test_resnet18_cifar_stem_has_no_maxpool_and_keeps_resolution():
    encoder = ResNet18(3, width=4)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in encoder.modules())
    stem_conv = encoder.stem[0]
    assert stem_conv.kernel_size == (3, 3) and stem_conv.stride == (1, 1)
    assert encoder(torch.rand(2, 3, 16, 16)).shape == (2, 32)
    # The standard network: 11.17 M parameters in the trunk of torchvision's resnet18 minus its
    # 7x7 stem (9408) plus a 3x3 stem (1728) and without the fc layer -> 11,168,832.
    assert sum(p.numel() for p in ResNet18(3).parameters()) == 11_168_832


def test_build_encoder_rejects_unknown_name():
    with pytest.raises(ValueError, match="encoder must be one of"):
        build_encoder("vgg", 3)
    with pytest.raises(ValueError, match="in_channels"):
        SmallCNN(0)


def test_projection_head_shape():
    assert ProjectionHead(32, 16, 8)(torch.rand(4, 32)).shape == (4, 8)


def _views(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.rand(n, 1, 28, 28, generator=g)


@pytest.mark.parametrize("method", ["simclr", "dcl", "supcon"])
def test_loss_is_the_library_loss_on_the_projections(method):
    torch.manual_seed(0)
    model = ContrastiveModel(method, "small", 1, temperature=0.3)
    a, b = _views()
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    loss = model.loss(a, b, labels)
    z = model.head(model.encoder(torch.cat([a, b])))
    z_a, z_b = z[:6], z[6:]
    expected = {"simclr": lambda: losses.nt_xent_views(z_a, z_b, temperature=0.3),
                "dcl": lambda: losses.dcl(z_a, z_b, temperature=0.3),
                "supcon": lambda: losses.supcon(torch.stack([z_a, z_b], 1), labels, temperature=0.3)}[method]()
    torch.testing.assert_close(loss, expected)


def test_moco_momentum_update_and_queue_ring_buffer():
    torch.manual_seed(0)
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, momentum=0.9, queue_size=12, projection_dim=8)
    # Move the online network away from the key network so the EMA is visible.
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.add_(1.0)
    key_before = copy.deepcopy(model.key_encoder.state_dict())
    online = copy.deepcopy(model.encoder.state_dict())
    queue_before = model.queue.keys.clone()
    a, b = _views(6)
    loss = model.loss(a, b)
    assert torch.isfinite(loss)
    name = "features.0.weight"
    torch.testing.assert_close(model.key_encoder.state_dict()[name], 0.9 * key_before[name] + 0.1 * online[name])
    # Keys of view b by the updated key network (train mode: BatchNorm on batch statistics),
    # L2-normalised, fill rows 0..5.
    with torch.no_grad():
        keys = F.normalize(model.key_head(model.key_encoder(b)), dim=1)
    torch.testing.assert_close(model.queue.keys[:6], keys)
    torch.testing.assert_close(model.queue.keys[6:], queue_before[6:])
    assert int(model.queue.pointer) == 6
    model.loss(a, b)
    model.loss(a, b)  # 18 keys into a 12-slot queue: the pointer wraps to 6
    assert int(model.queue.pointer) == 6


def test_moco_loss_uses_queue_as_negatives():
    torch.manual_seed(0)
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=6, projection_dim=8)
    model.eval()  # no EMA, no enqueue: the loss can be recomputed from the pieces
    a, b = _views(3)
    loss = model.loss(a, b)
    q = F.normalize(model.head(model.encoder(a)), dim=1)
    k = F.normalize(model.key_head(model.key_encoder(b)), dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ model.queue.keys.T], dim=1) / 0.2
    torch.testing.assert_close(loss, F.cross_entropy(logits, torch.zeros(3, dtype=torch.long)))


def test_supcon_needs_labels_and_moco_needs_queue():
    with pytest.raises(ValueError, match="queue_size"):
        ContrastiveModel("moco", "small", 1, temperature=0.2)
    model = ContrastiveModel("supcon", "small", 1, temperature=0.2)
    with pytest.raises(ValueError, match="labels"):
        model.loss(*_views(4))
    with pytest.raises(ValueError, match="method"):
        ContrastiveModel("byol", "small", 1, temperature=0.2)


def test_every_configurable_method_has_one_registered_method_object():
    from contrastkit.methods import METHOD_REGISTRY, Method, get_method, method_names

    assert method_names() == ("simclr", "moco", "supcon", "dcl", "simple", "hard_negative", "convirt", "siglip")
    assert tuple(METHOD_REGISTRY) == method_names()
    for name, method in METHOD_REGISTRY.items():
        assert isinstance(method, Method) and method.name == name and get_method(name) is method
    with pytest.raises(ValueError, match="method must be one of"):
        get_method("byol")
    with pytest.raises(ValueError, match="method must be one of simclr"):
        ContrastiveModel("convirt", "small", 1, temperature=0.2)  # a paired method: not two views


def test_moco_queue_starts_as_before_full_of_random_unit_keys():
    """The queue draws its random keys right after the encoder and head, as MoCo's own buffer
    did, so a seed gives the same initial negatives (and the same run) as before."""
    from contrastkit.models import ProjectionHead, build_encoder

    torch.manual_seed(3)
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=12, projection_dim=8)
    torch.manual_seed(3)
    encoder = build_encoder("small", 1)
    ProjectionHead(encoder.out_dim, hidden_dim=max(encoder.out_dim, 8), out_dim=8)
    expected = F.normalize(torch.randn(12, 8), dim=1)
    assert torch.equal(model.queue.negatives(), expected)
    assert torch.equal(model.key_encoder.state_dict()["features.0.weight"], encoder.state_dict()["features.0.weight"])


def test_moco_checkpoint_with_the_former_queue_buffers_still_loads():
    torch.manual_seed(0)
    trained = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=12, projection_dim=8)
    trained.loss(*_views(6))
    state = trained.state_dict()
    old = {k: v for k, v in state.items() if not k.startswith("queue.")}
    old["queue"], old["queue_pointer"] = state["queue.keys"], state["queue.pointer"]
    fresh = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=12, projection_dim=8)
    fresh.load_state_dict(old)
    assert torch.equal(fresh.queue.negatives(), trained.queue.negatives())
    assert int(fresh.queue.pointer) == 6 and int(fresh.queue.filled) == 12


def test_every_method_has_a_cross_rank_form():
    from contrastkit.methods import get_method

    for name in ("simclr", "moco", "supcon", "dcl", "simple", "hard_negative", "convirt"):
        assert get_method(name).cross_rank, name


def test_a_method_without_a_cross_rank_form_refuses_to_run_distributed():
    from contrastkit.methods import Simple

    class SingleProcessOnly(Simple):
        cross_rank = False

    model = ContrastiveModel("simple", "small", 1, temperature=0.2)
    model.distributed = True
    with pytest.raises(ValueError, match="method 'simple' has no cross-rank form yet"):
        SingleProcessOnly().loss(model, _views(4))

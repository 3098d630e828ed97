"""``orch rent``: rent an instance and add it as a host: a marketplace's best offer (vast.ai,
RunPod), or a provider's named GPU specification (AutoDL Pro: ``RentsBySpec``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import click
from click.core import ParameterSource
from pydantic import ValidationError

from orchestrator.access import rent as rented
from orchestrator.access.rent import RentRequest
from orchestrator.ask import confirm
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.providers.api import Provider
from orchestrator.providers.registry import PROVIDERS, RENTABLE
from orchestrator.spec.model import ENV_KEY_RE


@click.command("rent")
@click.argument("name")
@click.option("--provider", type=click.Choice(RENTABLE), required=True, help="The provider.")
@click.option("--gpu", required=True, help="GPU type, e.g. RTX_4090, \"A100 80GB\" (matched loosely; AutoDL: a Pro "
              "specification such as 4090D or 5090-p).")
@click.option("--count", type=click.IntRange(1, 16), default=1, show_default=True, help="GPUs in the instance.")
@click.option("--max-price", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Most USD per hour for the whole instance.")
@click.option("--disk", "disk_gb", type=click.IntRange(5, 10000), default=40, show_default=True,
              help="Disk in GB (RunPod: the volume at /workspace, kept while stopped; AutoDL: the system disk's "
              "expansion, 0 unless given).")
@click.option("--min-reliability", type=click.FloatRange(0, 1), default=None,
              help="Least reliability an offer may have (vast: 0.95 unless given).")
@click.option("--image", default=None, help="Container image (default: a PyTorch image of the provider's; AutoDL: a "
              "base image's uuid or tag, or one of your saved images).")
@click.option("--interruptible", is_flag=True, help="Rent an interruptible (spot) instance by a bid: cheaper, but the "
              "provider may stop it for a higher bid (vast.ai, RunPod; `orch instances` then shows it preempted).")
@click.option("--bid", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --interruptible: the bid in USD per hour for the whole instance (default: the offer's "
              "least bid); offers whose least bid is higher do not match.")
@click.option("--region", default=None, help="AutoDL: data centers to rent in, comma-separated codes or names "
              "(default: AutoDL chooses).")
@click.option("--token-env", default=None, help="Variable holding the API key (default "
              f"{' / '.join(PROVIDERS[name].token_env for name in RENTABLE)}).")
@click.option("--api-url", default=None, help="The provider's API (default: its own): a proxy, or a stand-in.")
@click.option("--key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SSH key to log in with (default: orch's own, made in ORCH_HOME/ssh the first time).")
@click.option("--root", default=None, help="Where orch keeps its files on the instance (RunPod: /workspace/orch).")
@click.option("--python", "python", default="python3", show_default=True, help="The instance's python.")
@click.option("--user", default="root", show_default=True, help="The login user of the image.")
@click.option("-y", "--yes", is_flag=True, help="Rent without asking (scripts).")
@pass_app
def rent_cmd(app: App, name: str, provider: str, gpu: str, count: int, max_price: float | None, disk_gb: int,
             min_reliability: float | None, image: str | None, interruptible: bool, bid: float | None,
             region: str | None, token_env: str | None, api_url: str | None, key: Path | None, root: str | None,
             python: str, user: str, yes: bool) -> None:
    """Rent a GPU instance on vast.ai or RunPod (search offers, show the best one and its price)
    or an AutoDL Pro instance (the GPU specification, image and region you name), create it after
    a yes (or --yes), wait until SSH answers, and add it as a host.

    The entry keeps the provider, the instance id, the token variable's NAME and --api-url,
    never the token. Creation is sent once, never retried. `orch down`/`up` stop and start it,
    `orch release` destroys it. --interruptible rents by a bid (shown with the on-demand price).

    \b
    Examples:
      export VAST_API_KEY=...
      orch rent g1 --provider vast --gpu RTX_4090 --max-price 0.5 --disk 60
      orch rent g2 --provider runpod --gpu "RTX 4090" --count 2 --yes
      orch rent s1 --provider vast --gpu RTX_4090 --interruptible --bid 0.25
      orch rent a1 --provider autodl --gpu 4090D --region westDC3 --yes
    """
    facts = PROVIDERS[provider]  # its token variable, image, root and presets (providers/registry.py)
    token_env = token_env or facts.token_env
    if not ENV_KEY_RE.match(token_env):
        raise UsageError(f"--token-env wants a variable NAME (like {facts.token_env}), got {token_env!r}")
    try:
        request = RentRequest(name=name, provider=provider, gpu=gpu, count=count, max_price=max_price, disk_gb=disk_gb,
                              min_reliability=min_reliability, image=image, interruptible=interruptible, bid=bid,
                              token_env=token_env, api_url=api_url, key=key, root=root, python=python, user=user)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise UsageError(f"invalid --{'-'.join(str(p) for p in error.get('loc', ()))}: {error['msg']}") from None
    request.wanted()  # a bid without --interruptible or above --max-price: exit 2 before anything else
    draft = rented.draft(app.inventory, request)
    command = _command(request, region)
    market = rented.market(request)
    if isinstance(market, RentsBySpec):
        given = click.get_current_context().get_parameter_source("disk_gb") != ParameterSource.DEFAULT
        assert facts.image is not None  # --provider is one of RENTABLE: each has an image
        return _rent_spec(app, market, draft, gpu, count, max_price, disk_gb if given else 0, min_reliability,
                          image or facts.image, region, key, yes, command)
    if region:
        raise UsageError(f"--region is for a provider that rents by specification; {provider} rents offers: "
                         "its search finds where")
    found = rented.offers(market, request)
    best = found[0]
    app.say(f"best of {len(found)} matching offer{'s' if len(found) != 1 else ''}: {provider} offer {best.id}: "
            f"{best.describe()}")
    price = (f"a bid of {best.price_per_hour:.3g} {best.currency}/h (interruptible: the provider may stop it for a "
             "higher bid)" if best.interruptible else f"{best.price_per_hour:.3g} {best.currency}/h")
    answer = yes or confirm(f"Rent it as {name} at {price} (billing starts now)?", default=False)
    if answer is None:
        raise UsageError("renting starts billing; to rent it: " + command)
    if not answer:
        raise UsageError("nothing was rented")
    rented.rent_offer(app.inventory, request, market, best, app.say)


class SpecOrder(Protocol):
    """What a ``RentsBySpec`` provider will rent, every word resolved."""

    def describe(self) -> str: ...


@runtime_checkable
class RentsBySpec(Protocol):
    """A provider that rents a named GPU specification rather than a marketplace offer
    (``providers/autodl.py``): ``order`` turns the user's words into what ``create_order``
    sends (exit 2 naming what exists), the price known only once the instance exists."""

    def order(self, gpu: str, count: int, image: str, region: str | None, disk_gb: int) -> SpecOrder: ...

    def create_order(self, order: Any, label: str) -> str: ...


def _rent_spec(app: App, provider: Provider, draft: Host, gpu: str, count: int, max_price: float | None,
               disk_gb: int, min_reliability: float | None, image: str, region: str | None,
               key: Path | None, yes: bool, command: str) -> None:
    """``orch rent`` for a ``RentsBySpec`` provider: the order shown, created once after a yes,
    the entry saved, then up as a marketplace instance is (the host key pinned, the price kept).
    The box logs in with the password its provider hands out, or ``--key`` where given."""
    assert isinstance(provider, RentsBySpec) and draft.provider is not None
    if max_price is not None or min_reliability is not None:
        raise UsageError(f"{provider.name} takes no --max-price or --min-reliability: it rents the specification "
                         "you name at its own price, shown once the instance exists")
    order = provider.order(gpu, count, image, region, disk_gb)
    app.say(f"{provider.name} Pro instance: {order.describe()}; pay as you go, at {provider.name}'s price "
            "(known once it exists)")
    answer = yes or confirm(f"Rent it as {draft.name} (billing starts once it runs)?", default=False)
    if answer is None:
        raise UsageError("renting starts billing; to rent it: " + command)
    if not answer:
        raise UsageError("nothing was rented")
    instance = provider.create_order(order, f"orch-{draft.name}")
    host = draft.model_copy(update={"provider": draft.provider.model_copy(update={"instance": instance}),
                                    "identity_file": str(key) if key else None})
    app.inventory.save(host)
    app.say(f"{draft.name}: rented {provider.name} instance {instance}; waiting until SSH answers")
    rented.wait_up(app.inventory, host, provider, instance, app.say)


def _command(request: RentRequest, region: str | None) -> str:
    """The ``orch rent ... --yes`` line that rents what this one showed."""
    argv = ["orch", "rent", request.name, "--provider", request.provider, "--gpu", request.gpu]
    argv += ["--count", str(request.count)] if request.count != 1 else []
    argv += ["--max-price", f"{request.max_price:g}"] if request.max_price is not None else []
    argv += ["--disk", str(request.disk_gb)] if request.disk_gb != 40 else []
    argv += ["--min-reliability", f"{request.min_reliability:g}"] if request.min_reliability is not None else []
    argv += ["--image", request.image] if request.image else []
    argv += ["--interruptible"] if request.interruptible else []
    argv += ["--bid", f"{request.bid:g}"] if request.bid is not None else []
    argv += ["--region", region] if region else []
    argv += ["--token-env", request.variable()] if request.variable() != PROVIDERS[request.provider].token_env else []
    argv += ["--api-url", request.api_url] if request.api_url else []
    argv += ["--key", str(request.key)] if request.key else []
    argv += ["--root", request.root] if request.root else []
    argv += ["--python", request.python] if request.python != "python3" else []
    argv += ["--user", request.user] if request.user != "root" else []
    return shlex.join([*argv, "--yes"])


COMMANDS = [rent_cmd]

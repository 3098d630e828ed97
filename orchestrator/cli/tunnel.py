"""``orch tunnel JOB|HOST [PORT]...``: a port of the box on the laptop (``orchestrator/tunnel/``)."""

from __future__ import annotations

import click

from orchestrator.cli.app import App, pass_app


@click.command("tunnel")
@click.argument("name", metavar="JOB|HOST")
@click.argument("ports", nargs=-1, metavar="[PORT|HOST:PORT]...")
@click.option("--local", "local", type=int, multiple=True, metavar="LPORT",
              help="The laptop's port for each PORT, in order (default: the same number; 0: a free one).")
@click.option("--bind", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="The laptop's address to listen on (0.0.0.0: reachable from other machines too).")
@pass_app
def tunnel_cmd(app: App, name: str, ports: tuple[str, ...], local: tuple[int, ...], bind: str) -> None:
    """Forward local ports to a box through orch's own SSH connection, and print the local URLs.

    PORT is a port on the box (`6006`), or HOST:PORT as the box reaches it. A JOB's ports are on
    its first node (a Slurm job's compute node, through the login node); without PORT, the job's
    `launch.ports` are opened. The tunnel connects again by itself after a dropped link or a power
    cycle (a provider host's new endpoint is asked of its provider) and runs until Ctrl-C.

    \b
    Examples:
      orch tunnel box 6006                   # http://127.0.0.1:6006 -> localhost:6006 on box
      orch tunnel gpt2-lora                  # the job's launch.ports
      orch tunnel box 8888 6006 --local 0 --local 16006
      orch tunnel box db.internal:5432       # an address the box reaches
    """
    from orchestrator.tunnel.start import forwards_for, open_tunnel
    from orchestrator.tunnel.target import resolve

    target = resolve(name, app.inventory, app.registry)
    forwards = forwards_for(target, ports, local)
    if target.host.kind == "local":
        for f in forwards:
            click.echo(f"http://127.0.0.1:{f.port}")
        app.say("local is this machine: its ports are here already, no tunnel is needed")
        return
    tunnel = None
    try:
        tunnel = open_tunnel(target, forwards, app.inventory, bind, app.say)
        for line in tunnel.lines():
            click.echo(line)
        app.say(f"forwarding through {target.host.name} ({tunnel.link.endpoint()}); Ctrl-C ends the tunnel")
        tunnel.wait()
    except KeyboardInterrupt:
        app.say("tunnel closed")
        raise SystemExit(130) from None
    finally:
        if tunnel is not None:
            tunnel.close()


COMMANDS = [tunnel_cmd]

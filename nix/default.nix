# Entry point without flakes:
#   nix-build nix -A hive
# and in a NixOS configuration:
#   imports = [ ./hyperhive/nix/module.nix ];   # one agent (hive serve)
#   imports = [ ./hyperhive/nix/host.nix ];     # the broker
{ pkgs ? import <nixpkgs> { }, rev ? "nix" }:
{
  hive = pkgs.callPackage ./package.nix { inherit rev; };
  env = import ./env.nix;
}

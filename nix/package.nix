# The hive binary, static (musl) through pkgsStatic:
#   nix-build nix -A hive      (nix/default.nix)
# HYPERHIVE_REV is what `hive --version` reports; the source has no .git here.
{ lib, pkgsStatic, rev ? "nix" }:

pkgsStatic.rustPlatform.buildRustPackage {
  pname = "hyperhive";
  version = (lib.importTOML ../Cargo.toml).package.version;

  src = lib.cleanSourceWith {
    src = ../.;
    filter = path: type:
      let base = baseNameOf path; in
      !(lib.elem base [ "target" ".cache" "node_modules" ".git" "nix" ]);
  };
  cargoLock.lockFile = ../Cargo.lock;

  HYPERHIVE_REV = rev;
  # The bundled sqlite is compiled with the static C toolchain pkgsStatic provides.
  # The test suite needs the real Claude Code CLI and root; CI runs it instead.
  doCheck = false;

  meta = {
    description = "hive: keeps Claude Code agents alive as message-driven daemons";
    license = lib.licenses.mit;
    mainProgram = "hive";
    platforms = lib.platforms.linux;
  };
}

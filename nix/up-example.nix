# host.nix with services.hyperhive.up enabled, evaluated against the stub lib
# and pkgs (nix/stub.nix) for given agents: the generated fleet file's text
# and the activation step's script, with the hive package, the data dir and
# the declared file's path given, so tests/nix.rs can write the one and run
# the other on real files with the hive binary under test. nix/tests-up.nix
# checks the unit the same way.
{ hive ? "/nix/store/stub-hive"
, dataDir ? "/var/lib/hyperhive"
, declaredPath ? "/nix/store/stub-hive.json"
, user ? "hyperhive"
, group ? "hyperhive"
, hiveName ? "pr1ma"
, operatorPronouns ? null
, contextWindowTokens ? { }
, upOver ? { }
, agents
}:
let
  env = import ./env.nix;
  stub = import ./stub.nix;
  pkgs = stub.pkgs // {
    writeText = name: text: { outPath = declaredPath; inherit name text; };
  };
  cfg = {
    enable = true;
    package = { outPath = hive; name = "hive"; };
    stateDir = dataDir;
    runDir = "/run/hyperhive";
    inherit hiveName operatorPronouns contextWindowTokens agents;
    swarmName = null;
    operatorGid = null;
    durability = "normal";
    matrix = env.matrixDefaults // { homeserver = ""; userId = ""; room = ""; };
    up = env.upDefaults // { enable = true; inherit user group; } // upOver;
  };
  host = (import ./host.nix { inherit (stub) lib; inherit pkgs; config.services.hyperhive = cfg; }).config;
in
{
  inherit host;
  fleet = host.services.hyperhive.up.fleetFile.text;
  activation = host.system.activationScripts.hyperhive-fleet.text;
  unit = host.systemd.services.hyperhive;
}

# Small wiring checks the spec audit found untested (issue 15 item 10), run by
# tests/nix.rs:
#   nix-instantiate --eval --strict --json nix/tests-small.nix
# evaluates to the list of failures: `hive wake` (the package) is on the
# container's PATH (Wk2), claudePluginsAutoUpdate reaches the unit (N15), and
# forge.url = "" reaches hive as an empty HIVE_FORGE_URL, which switches forge
# notifications off (unset, hive would use its default URL).
let
  env = import ./env.nix;
  inherit (import ./stub.nix) lib pkgs drv;

  check = name: got: want:
    if got == want then [ ] else [ "${name}: got ${builtins.toJSON got}, want ${builtins.toJSON want}" ];

  agentCfg = over: env.defaults // {
    enable = true;
    label = "ana";
    parent = null;
    package = drv "hive";
    stateDir = "/var/lib/hyperhive/ana";
    extraPackages = [ ];
    user = { name = "hive-ana"; uid = null; gid = null; passwordlessSudo = false; };
  } // over;
  agent = cfg: (import ./module.nix { inherit lib pkgs; config.hyperhive = cfg; }).config;
  unitEnv = cfg: (agent cfg).systemd.services.hyperhive-agent.environment;

  a = agent (agentCfg { });
in
check "hive (and so hive wake) on the system PATH" (map (p: p.name) a.environment.systemPackages) [ "hive" ]
++ check "auto-update on" (unitEnv (agentCfg { claudePluginsAutoUpdate = true; })).HIVE_CLAUDE_PLUGINS_AUTO_UPDATE "true"
++ check "auto-update off by default" (unitEnv (agentCfg { })).HIVE_CLAUDE_PLUGINS_AUTO_UPDATE "false"
++ check "forge off" (unitEnv (agentCfg { forge.url = ""; })).HIVE_FORGE_URL ""
++ check "forge on" (unitEnv (agentCfg { forge.url = "https://forge.example"; })).HIVE_FORGE_URL "https://forge.example"

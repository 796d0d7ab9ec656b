# Wiring checks of host.nix with services.hyperhive.up enabled (the whole
# hive as one unit), run by tests/nix.rs:
#   nix-instantiate --eval --strict --json nix/tests-up.nix
# evaluates to the list of failures: `hive up` as hyperhive.service under a
# dedicated non-root user with HIVE_ISOLATION=required, `hive reload` on a
# rebuild that changes only the fleet file, the activation step that merges
# the declared fleet file into DATA/hive.json, and every per-agent option
# under its fleet-file key. tests/nix.rs also runs hive's own validation on
# the generated file and the activation step on real files.
let
  check = name: got: want:
    if got == want then [ ] else [ "${name}: got ${builtins.toJSON got}, want ${builtins.toJSON want}" ];

  ex = import ./up-example.nix {
    operatorPronouns = "they/them";
    contextWindowTokens = { sonnet = 1000000; };
    upOver = {
      extraPackages = [ (import ./stub.nix).pkgs.claude-code ];
      budget = { usd = 50.0; per = "day"; };
      maxClaude = 4;
      notify = { give_up_days = 3; to = [ { url = "https://hooks.example/hive"; events = [ "question" "dead_letter" ]; } ]; };
      telemetry = { endpoint = "http://127.0.0.1:4318"; };
    };
    agents = {
      ruth = { model = "sonnet"; toolGroups = [ "messaging" "meta" "inbox" "execution" "lifecycle" "approvals" ]; };
      ana = {
        parent = "ruth";
        icon = "/nix/store/x-icon.svg";
        staticDir = "/nix/store/x-static";
        webDist = "/nix/store/x-dist";
        dashboardLinks = [ { label = "Stats"; url = "https://stats.example/"; icon = "📊"; } { label = "Docs"; url = "https://docs.example/"; icon = ""; } ];
        cargo.shortMessages = false;
        autoCompact = false;
        forge.url = "";
        matrix.url = "https://matrix.example";
        claudeMarketplaces = [ "anthropics/claude-plugins-official" "me/market" ];
        claudePlugins = [ "formatter@me" ];
        claudePluginsAutoUpdate = true;
        extraMcpServers.search = { command = "/bin/search-mcp"; args = [ ]; allowedTools = [ "*" ]; };
        extraEnv = { HIVE_TURN_TIMEOUT_SECS = "1800"; };
        account = "team";
        budget = { usd = 5.0; per = "week"; };
        turnUsd = 0.5;
      };
    };
  };
  unit = ex.unit;
  fleet = builtins.fromJSON ex.fleet;
  ana = builtins.head (builtins.filter (a: a.name == "ana") fleet.agents);
  ruth = builtins.head (builtins.filter (a: a.name == "ruth") fleet.agents);
  plain = (import ./up-example.nix { agents.ruth = { }; upOver = { enable = false; }; }).host;
in
check "exec" unit.serviceConfig.ExecStart
  "/nix/store/stub-hive/bin/hive up --config /var/lib/hyperhive/hive.json --data /var/lib/hyperhive"
++ check "reload" unit.serviceConfig.ExecReload "/nix/store/stub-hive/bin/hive reload --socket /var/lib/hyperhive/run/host.sock"
++ check "a dedicated non-root user" [ unit.serviceConfig.User unit.serviceConfig.Group ex.host.users.users.hyperhive.isSystemUser (ex.host.users.groups ? hyperhive) ]
  [ "hyperhive" "hyperhive" true true ]
++ check "isolation required" unit.environment.HIVE_ISOLATION "required"
++ check "hive up's HOME is not its data dir (hive up refuses that)" [ (unit.environment ? HOME) (ex.host.users.users.hyperhive ? home) ] [ false false ]
++ check "host socket for hive reload and the operator" [ unit.environment.HIVE_HOST_SOCKET ex.host.environment.variables.HIVE_HOST_SOCKET ]
  [ "/var/lib/hyperhive/run/host.sock" "/var/lib/hyperhive/run/host.sock" ]
++ check "reload on the fleet file, restart on the package" [ (map (d: d.outPath) unit.reloadTriggers) (map (d: d.outPath) unit.restartTriggers) ]
  [ [ "/nix/store/stub-hive.json" ] [ "/nix/store/stub-hive" ] ]
++ check "state dir" [ unit.serviceConfig.StateDirectory unit.serviceConfig.WorkingDirectory ] [ "hyperhive" "/var/lib/hyperhive" ]
++ check "PATH" (map (p: p.name) unit.path) [ "bash" "coreutils" "git" "claude-code" ]
++ check "no namespace restrictions that would stop the sandboxes" (builtins.filter (k: builtins.hasAttr k unit.serviceConfig) [ "RestrictNamespaces" "PrivateUsers" "ProtectProc" "ProcSubset" "ProtectKernelTunables" "ProtectKernelLogs" "SystemCallFilter" ]) [ ]
++ check "no plain broker, no bridge unit under hive up" [ ex.host.systemd.services.hyperhive-broker ex.host.systemd.services.hyperhive-matrix-bridge ex.host.systemd.tmpfiles.rules ] [ { } { } [ ] ]
++ check "the plain broker without up" [ (plain.systemd.services.hyperhive or { }) (plain.systemd.services.hyperhive-broker ? serviceConfig) plain.system.activationScripts.hyperhive-fleet ] [ { } true { } ]
++ check "activation merges the declared file" ex.activation ''
  install -d -m 0750 -o hyperhive -g hyperhive /var/lib/hyperhive
  if ! /nix/store/stub-hive/bin/hive fleet merge /nix/store/stub-hive.json --into /var/lib/hyperhive/hive.json --base /var/lib/hyperhive/hive.declared.json; then
    echo "hyperhive: the declared fleet file was not installed into /var/lib/hyperhive/hive.json (see above); the hive keeps running with the file as it is" >&2
    false
  fi
  chown hyperhive:hyperhive /var/lib/hyperhive/hive.json /var/lib/hyperhive/hive.declared.json
''
++ check "activation after users" ex.host.system.activationScripts.hyperhive-fleet.deps [ "users" "groups" ]
++ check "top level" [ fleet.hive_name fleet.web fleet.budget ] [ "pr1ma" { listen = "127.0.0.1:7890"; } { usd = 50.0; per = "day"; } ]
++ check "max_claude, notify and telemetry" [ fleet.max_claude fleet.notify fleet.telemetry ] [
  4
  { give_up_days = 3; to = [ { url = "https://hooks.example/hive"; events = [ "question" "dead_letter" ]; } ]; }
  { endpoint = "http://127.0.0.1:4318"; }
]
++ check "every per-agent option under its key" ana {
  name = "ana";
  parent = "ruth";
  icon = "/nix/store/x-icon.svg";
  static_dir = "/nix/store/x-static";
  web_dist = "/nix/store/x-dist";
  dashboard_links = [ { label = "Stats"; url = "https://stats.example/"; icon = "📊"; } { label = "Docs"; url = "https://docs.example/"; } ];
  cargo_short_messages = false;
  auto_compact = false;
  forge_url = "";
  matrix_url = "https://matrix.example";
  claude_marketplaces = [ "anthropics/claude-plugins-official" "me/market" ];
  claude_plugins = [ "formatter@me" ];
  claude_plugins_auto_update = true;
  extra_mcp_servers.search = { command = "/bin/search-mcp"; args = [ ]; allowedTools = [ "*" ]; };
  env = { HOME = "/var/lib/hyperhive/agents/ana/state"; HIVE_TURN_TIMEOUT_SECS = "1800"; };
  account = "team";
  budget = { usd = 5.0; per = "week"; };
  turn_usd = 0.5;
  operator_pronouns = "they/them";
  context_window_tokens = { sonnet = 1000000; };
}
++ check "defaults are left out" ruth {
  name = "ruth";
  env.HOME = "/var/lib/hyperhive/agents/ruth/state";
  model = "sonnet";
  tool_groups = [ "messaging" "meta" "inbox" "execution" "lifecycle" "approvals" ];
  operator_pronouns = "they/them";
  context_window_tokens = { sonnet = 1000000; };
}

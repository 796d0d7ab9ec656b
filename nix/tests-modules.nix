# Wiring checks of module.nix and host.nix without nixpkgs, run by tests/nix.rs:
#   nix-instantiate --eval --strict --json nix/tests-modules.nix
# evaluates to the list of failures. The NixOS module system is replaced by a
# stub lib that returns option declarations as written and a stub pkgs whose
# derivations are fixed store paths (nix/stub.nix, shared with
# nix/tests-bash.nix and nix/tests-small.nix); the modules' `config` is then
# evaluated for given option values. This checks what the modules do with the
# values (environment, unit, users, files), not nixpkgs itself.
let
  env = import ./env.nix;

  inherit (import ./stub.nix) lib pkgs drv;

  check = name: got: want:
    if got == want then [ ] else [ "${name}: got ${builtins.toJSON got}, want ${builtins.toJSON want}" ];

  agentCfg = over: env.defaults // {
    enable = true;
    label = "ana";
    parent = "ruth";
    package = drv "hive";
    stateDir = "/var/lib/hyperhive/ana";
    extraPackages = [ pkgs.claude-code ];
    user = { name = "hive-ana"; uid = 1001; gid = 1001; passwordlessSudo = true; };
  } // over;
  agent = cfg: (import ./module.nix {
    inherit lib pkgs;
    config.hyperhive = cfg;
  }).config;

  a = agent (agentCfg {
    model = "sonnet";
    icon = "/src/icon.svg";
    frontend = { dist = null; extraFiles."games/bb" = { source = "/src/bb"; target = null; }; };
  });
  unit = a.systemd.services.hyperhive-agent;

  plain = agent (agentCfg { cargo.shortMessages = false; user = { name = "hive-ana"; uid = null; gid = null; passwordlessSudo = false; }; });

  # The identity, pronouns, windows and extra MCP servers of item 6.
  named = agent (agentCfg {
    hiveName = "pr1ma";
    swarmName = "constellat1on";
    operatorPronouns = "they/them";
    contextWindowTokens = { sonnet = 1000000; "claude-opus-4.1" = 1000000; };
    extraMcpServers.search = { command = "/bin/search-mcp"; args = [ "--stdio" ]; allowedTools = [ "*" ]; };
  });
  # The agent options' defaults, with and without the host module on the same host.
  optionsWith = services: (import ./module.nix {
    inherit lib pkgs;
    config = { hyperhive = agentCfg { }; } // services;
  }).options.hyperhive;
  onHost = optionsWith {
    services.hyperhive = {
      hiveName = "pr1ma"; swarmName = null;
      operatorPronouns = "they/them";
      contextWindowTokens = { sonnet = 1000000; opus = 1000000; haiku = 200000; };
    };
  };
  alone = optionsWith { };
  defaultsOf = o: map (n: o.${n}.default) [ "hiveName" "swarmName" "operatorPronouns" "contextWindowTokens" "extraMcpServers" ];

  hostCfg = over: {
    enable = true;
    package = drv "hive";
    stateDir = "/var/lib/hyperhive";
    runDir = "/run/hyperhive";
    hiveName = "pr1ma"; swarmName = null; operatorGid = null;
    operatorPronouns = null; contextWindowTokens = { };
    durability = "normal";
    agents.ana = a.hyperhive.brokerEntry;
    matrix = env.matrixDefaults // { homeserver = ""; userId = ""; room = ""; };
    up = env.upDefaults;
  } // over;
  hostOf = cfg: (import ./host.nix {
    inherit lib pkgs;
    config.services.hyperhive = cfg;
  }).config;
  host = hostOf (hostCfg { });
  swarm = hostOf (hostCfg {
    hiveName = "one";
    matrix = env.matrixDefaults // {
      enable = true;
      homeserver = "https://matrix.example.org";
      userId = "@hive-one-bridge:example.org";
      passwordFile = "/run/keys/matrix-password";
      room = "#swarm:example.org";
      peers.two = "@hive-two-bridge:example.org";
    };
  });
  bridge = swarm.systemd.services.hyperhive-matrix-bridge;
in
check "agent env" unit.environment {
  HOME = "/var/lib/hyperhive/ana";
  HIVE_LABEL = "ana";
  HIVE_SOCKET = "/run/hive/mcp.sock";
  HIVE_BASH_SOCKET = "/run/hive-bash/socket";
  HIVE_DEFAULT_MODEL = "sonnet";
  HIVE_AUTO_COMPACT = "true";
  HIVE_ICON = "/src/icon.svg";
  HIVE_STATIC_DIR = "/nix/store/stub-hyperhive-ana-static";
  HIVE_TOOL_GROUPS = "messaging,meta,inbox,execution";
  HIVE_PORT = "7700";
  HIVE_BIND = "127.0.0.1";
  HIVE_CLAUDE_MARKETPLACES = "anthropics/claude-plugins-official";
  HIVE_CLAUDE_PLUGINS = "";
  HIVE_CLAUDE_PLUGINS_AUTO_UPDATE = "false";
  HIVE_FORGE_URL = "http://localhost:3000";
  HIVE_MATRIX_URL = "http://localhost:8008";
  HIVE_BASH_ENV = "/etc/hyperhive/bash-env.sh";
}
++ check "exec" unit.serviceConfig.ExecStart
  "/nix/store/stub-hive/bin/hive serve --state-dir /var/lib/hyperhive/ana --run-dir /run/hyperhive-agent"
++ check "user" [ unit.serviceConfig.User a.users.users.hive-ana.uid a.users.groups.hive-ana.gid ] [ "hive-ana" 1001 1001 ]
++ check "path" (map (p: p.name) unit.path) [ "bash" "coreutils" "git" "claude-code" ]
++ check "sudo" a.security.sudo.extraRules [ { users = [ "hive-ana" ]; commands = [ { command = "ALL"; options = [ "NOPASSWD" ]; } ]; } ]
++ check "sudo keeps NoNewPrivileges off" unit.serviceConfig.NoNewPrivileges false
++ check "no sudo" [ plain.security.sudo.extraRules plain.systemd.services.hyperhive-agent.serviceConfig.NoNewPrivileges ] [ [ ] true ]
++ check "bash-env installed" a.environment.etc."hyperhive/bash-env.sh".source.name "hyperhive-bash-env.sh"
++ check "bash-env off" [ plain.environment.etc."hyperhive/bash-env.sh" (plain.systemd.services.hyperhive-agent.environment ? HIVE_BASH_ENV) ] [ { } false ]
++ check "links file" a.systemd.tmpfiles.rules [
  "d /var/lib/hyperhive/ana 0750 hive-ana hive-ana -"
  "L+ /var/lib/hyperhive/ana/hyperhive-dashboard-links.json - - - - /nix/store/stub-hyperhive-dashboard-links.json"
]
++ check "assertions hold" (builtins.filter (x: !x.assertion) a.assertions) [ ]
++ check "bad target asserted" (map (x: x.assertion)
  (builtins.filter (x: !x.assertion) (agent (agentCfg {
    frontend = { dist = null; extraFiles.x = { source = "/s"; target = "../x"; }; };
  })).assertions)) [ false ]
++ check "broker entry" a.hyperhive.brokerEntry {
  parent = "ruth"; model = "sonnet"; allowedRecipients = [ ];
  toolGroups = [ "messaging" "meta" "inbox" "execution" ];
  socketUid = 1001; socketGid = 1001;
}
++ check "broker exec" host.systemd.services.hyperhive-broker.serviceConfig.ExecStart
  "/nix/store/stub-hive/bin/hive broker --state-dir /var/lib/hyperhive --run-dir /run/hyperhive --config /nix/store/stub-hive.json --durability normal"
++ check "broker state dir" host.systemd.services.hyperhive-broker.serviceConfig.StateDirectory "hyperhive"
++ check "host socket" host.environment.variables.HIVE_HOST_SOCKET "/run/hyperhive/host.sock"
++ check "no bridge without a swarm" host.systemd.services.hyperhive-matrix-bridge { }
++ check "bridge exec" bridge.serviceConfig.ExecStart
  "/nix/store/stub-hive/bin/hive matrix-bridge --socket /run/hyperhive/bridge.sock --state-dir /var/lib/hyperhive-matrix"
++ check "bridge has the network, the broker does not"
  [ bridge.serviceConfig.RestrictAddressFamilies swarm.systemd.services.hyperhive-broker.serviceConfig.RestrictAddressFamilies ]
  [ [ "AF_UNIX" "AF_INET" "AF_INET6" ] [ "AF_UNIX" ] ]
++ check "bridge restarts, but not after a refused login"
  [ bridge.serviceConfig.Restart bridge.serviceConfig.RestartPreventExitStatus bridge.serviceConfig.CapabilityBoundingSet ]
  [ "always" 2 "" ]
++ check "bridge state dir" bridge.serviceConfig.StateDirectory "hyperhive-matrix"
++ check "bridge after the broker" bridge.after [ "hyperhive-broker.service" "network-online.target" ]
++ check "assertions without a swarm" host.assertions [ ]
++ check "swarm assertions hold" (builtins.filter (x: !x.assertion) swarm.assertions) [ ]
++ check "a swarm needs a hive name" (map (x: x.assertion) (builtins.filter (x: !x.assertion)
  (hostOf (hostCfg { hiveName = null; matrix = (hostCfg { }).matrix // { enable = true; homeserver = "https://m"; userId = "@u:m"; passwordFile = "/p"; room = "#r:m"; }; })).assertions)) [ false ]
++ check "identity, pronouns, windows, extra servers" (builtins.removeAttrs named.systemd.services.hyperhive-agent.environment (builtins.attrNames unit.environment)) {
  HIVE_HIVE_NAME = "pr1ma";
  HIVE_SWARM_NAME = "constellat1on";
  HIVE_OPERATOR_PRONOUNS = "they/them";
  HIVE_CONTEXT_WINDOW_TOKENS_SONNET = "1000000";
  HIVE_CONTEXT_WINDOW_TOKENS_CLAUDE_OPUS_4_1 = "1000000";
  HIVE_EXTRA_MCP_SERVERS = builtins.toJSON { search = { command = "/bin/search-mcp"; args = [ "--stdio" ]; allowedTools = [ "*" ]; }; };
}
++ check "none of them by default" (builtins.filter (n: builtins.elem n [ "HIVE_HIVE_NAME" "HIVE_SWARM_NAME" "HIVE_OPERATOR_PRONOUNS" "HIVE_EXTRA_MCP_SERVERS" ] || builtins.substring 0 26 n == "HIVE_CONTEXT_WINDOW_TOKENS") (builtins.attrNames unit.environment)) [ ]
++ check "agent defaults from the host module" (defaultsOf onHost) [ "pr1ma" null "they/them" { sonnet = 1000000; opus = 1000000; haiku = 200000; } { } ]
++ check "agent defaults without it" (defaultsOf alone) [ null null null { } { } ]
++ check "host options unset by default" (let o = (import ./host.nix { inherit lib pkgs; config.services.hyperhive = { enable = false; }; }).options.services.hyperhive; in [ o.operatorPronouns.default o.contextWindowTokens.default ]) [ null { } ]

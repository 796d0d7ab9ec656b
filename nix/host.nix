# NixOS module for the host side: `hive broker` with the hive config generated
# from `services.hyperhive.agents` (docs/config.md). Each agent entry can be an
# agent module's `hyperhive.brokerEntry`, e.g. for NixOS containers:
#
#   services.hyperhive.agents.ana = config.containers.ana.config.hyperhive.brokerEntry;
#
# `hive up` (the fleet command that also starts the harnesses) is the
# alternative to this unit; docs/systemd/hive-up.service is an example.
#
# With `services.hyperhive.matrix.enable`, the hive config gets a `matrix`
# section and `hive matrix-bridge` runs as a unit of its own, the only one with
# network access (the broker's stays AF_UNIX-only); see docs/swarm.md.
#
# With `services.hyperhive.up.enable`, the host runs the whole hive instead:
# `hive up` (broker, supervisor, dashboard, bash daemons, the bridge) as one
# unit, `hyperhive.service`, under a dedicated non-root user with
# HIVE_ISOLATION=required. The agents' per-agent options become the fleet
# file (env.fleetFile), which an activation step merges into the writable
# DATA/hive.json with the operator's writes (`hive fleet merge`); a rebuild
# that changes only the fleet file reloads the unit (`hive reload`).
{ config, lib, pkgs, ... }:

let
  cfg = config.services.hyperhive;
  up = cfg.up;
  env = import ./env.nix;
  inherit (lib) mkOption mkEnableOption mkIf types literalExpression;

  agents = lib.mapAttrs (_: a: lib.filterAttrs (_: v: v != null) a) cfg.agents;

  configFile = pkgs.writeText "hive.json" (env.hiveConfig {
    inherit (cfg) hiveName swarmName operatorGid matrix;
    inherit agents;
  });

  # A nix path (./icon.svg) is copied into the store; a string stays as it is.
  storePath = v: if v == null then null else "${v}";
  # The host's operatorPronouns and contextWindowTokens are every agent's
  # defaults, as for the agent modules; HOME is the agent's state dir, as an
  # agent module's (hive up's own HOME may not be in its data dir).
  fleetAgent = name: a: a // {
    extraEnv = { HOME = "${cfg.stateDir}/agents/${name}/state"; } // (a.extraEnv or { });
    icon = storePath (a.icon or null);
    staticDir = storePath (a.staticDir or null);
    webDist = storePath (a.webDist or null);
    operatorPronouns = if (a.operatorPronouns or null) != null then a.operatorPronouns else cfg.operatorPronouns;
    contextWindowTokens = cfg.contextWindowTokens // (a.contextWindowTokens or { });
  };
  declared = pkgs.writeText "hive.json" (env.fleetFile {
    inherit (cfg) hiveName swarmName operatorGid matrix;
    inherit (up) budget retention maxClaude notify telemetry;
    web = lib.filterAttrs (_: v: v != null && v != { }) {
      listen = up.listen;
      public_origin = up.publicOrigin;
      script_pages = up.scriptPages;
    };
    agents = lib.mapAttrs fleetAgent agents;
  });
  hostSocket = "${cfg.stateDir}/run/host.sock";
in
{
  options.services.hyperhive = {
    enable = mkEnableOption "the hyperhive broker (hive broker)";

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix { };
      defaultText = literalExpression "pkgs.callPackage ./package.nix { }";
      description = "The hive package.";
    };

    stateDir = mkOption { type = types.str; default = "/var/lib/hyperhive"; description = "Where broker.db lives."; };
    runDir = mkOption {
      type = types.str;
      default = "/run/hyperhive";
      description = "Sockets: RUN/host.sock and RUN/agents/NAME/mcp.sock (bind-mount RUN/agents/NAME to /run/hive in the agent).";
    };
    hiveName = mkOption { type = types.nullOr types.str; default = null; description = "hive_name."; };
    swarmName = mkOption { type = types.nullOr types.str; default = null; description = "swarm_name."; };
    operatorPronouns = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "they/them";
      description = "The operator's pronouns in every agent's system prompt; the default of each agent module's hyperhive.operatorPronouns on this host (pass it on to containers).";
    };
    contextWindowTokens = mkOption {
      type = types.attrsOf types.ints.positive;
      default = { };
      example = literalExpression "{ sonnet = 1000000; opus = 1000000; haiku = 200000; }";
      description = "Context windows by a part of the model name; the default of each agent module's hyperhive.contextWindowTokens on this host. Unset by default: the window the CLI reports wins.";
    };
    operatorGid = mkOption { type = types.nullOr types.int; default = null; description = "Group of the host socket (then mode 0660)."; };
    durability = mkOption { type = types.enum [ "normal" "full" ]; default = "normal"; description = "--durability."; };

    matrix = {
      enable = mkEnableOption "the Matrix bridge (hive matrix-bridge), which joins this hive to its swarm";
      homeserver = mkOption { type = types.str; example = "https://matrix.example.org"; description = "The homeserver's base URL (matrix.homeserver)."; };
      userId = mkOption { type = types.str; example = "@hive-one-bridge:example.org"; description = "The bridge's Matrix user (matrix.user_id)."; };
      passwordFile = mkOption { type = types.nullOr types.str; default = env.matrixDefaults.passwordFile; description = "A file with its password, readable by root (matrix.password_file); or accessTokenFile."; };
      accessTokenFile = mkOption { type = types.nullOr types.str; default = env.matrixDefaults.accessTokenFile; description = "A file with an access token of the bridge user (matrix.access_token_file)."; };
      room = mkOption { type = types.str; example = "#swarm:example.org"; description = "The swarm's room, by id or alias (matrix.room)."; };
      peers = mkOption { type = types.attrsOf types.str; default = env.matrixDefaults.peers; example = { two = "@hive-two-bridge:example.org"; }; description = "The other hives: hive name -> its bridge's Matrix user (matrix.peers)."; };
      deviceId = mkOption { type = types.nullOr types.str; default = env.matrixDefaults.deviceId; description = "The bridge's fixed device (matrix.device_id); HIVE_<HIVENAME>_BRIDGE by default."; };
      operators = mkOption { type = types.listOf types.str; default = env.matrixDefaults.operators; description = "Matrix users who may write to the agents from operatorRoom (matrix.operators)."; };
      operatorRoom = mkOption { type = types.nullOr types.str; default = env.matrixDefaults.operatorRoom; description = "The operator room (matrix.operator_room): the operator's mail is posted there too."; };
      stateDir = mkOption { type = types.str; default = env.matrixDefaults.stateDir; description = "Where the bridge keeps its access token (0600)."; };
    };

    agents = mkOption {
      type = types.attrsOf (types.submodule {
        freeformType = types.attrs;
        options = {
          parent = mkOption { type = types.nullOr types.str; default = null; };
          model = mkOption { type = types.nullOr types.str; default = null; };
          allowedRecipients = mkOption { type = types.listOf types.str; default = [ ]; };
          toolGroups = mkOption { type = types.nullOr (types.listOf types.str); default = null; };
          capabilities = mkOption { type = types.listOf types.str; default = [ ]; };
          socketUid = mkOption { type = types.nullOr types.int; default = null; };
          socketGid = mkOption { type = types.nullOr types.int; default = null; };
          # The per-agent options of an agent module, for `hive up` (up.enable):
          # each becomes its fleet-file key (docs/deploy.md). null: the default.
          autoCompact = mkOption { type = types.nullOr types.bool; default = null; description = "auto_compact (true when null)."; };
          icon = mkOption { type = types.nullOr (types.either types.path types.str); default = null; description = "icon: an SVG, copied to the store."; };
          dashboardLinks = mkOption { type = types.listOf types.attrs; default = [ ]; description = "dashboard_links: [ { label; url; icon; } ]."; };
          staticDir = mkOption { type = types.nullOr (types.either types.path types.str); default = null; description = "static_dir: files served under the page's own paths (frontend.extraFiles as one tree)."; };
          webDist = mkOption { type = types.nullOr (types.either types.path types.str); default = null; description = "web_dist: a directory that replaces the built-in page (frontend.dist)."; };
          forge.url = mkOption { type = types.nullOr types.str; default = null; description = "forge_url (\"\" switches forge notifications off)."; };
          matrix.url = mkOption { type = types.nullOr types.str; default = null; description = "matrix_url."; };
          claudeMarketplaces = mkOption { type = types.nullOr (types.listOf types.str); default = env.defaults.claudeMarketplaces; description = "claude_marketplaces: the official marketplace by default, as for an agent module (null: none)."; };
          claudePlugins = mkOption { type = types.listOf types.str; default = [ ]; description = "claude_plugins."; };
          claudePluginsAutoUpdate = mkOption { type = types.bool; default = false; description = "claude_plugins_auto_update."; };
          cargo.shortMessages = mkOption { type = types.bool; default = true; description = "cargo_short_messages."; };
          operatorPronouns = mkOption { type = types.nullOr types.str; default = null; description = "operator_pronouns (the host's operatorPronouns when null)."; };
          contextWindowTokens = mkOption { type = types.attrsOf types.ints.positive; default = { }; description = "context_window_tokens, over the host's contextWindowTokens."; };
          extraMcpServers = mkOption { type = types.attrsOf types.attrs; default = { }; description = "extra_mcp_servers."; };
          extraEnv = mkOption { type = types.attrsOf types.str; default = { }; description = "env: more environment for the agent's harness."; };
          account = mkOption { type = types.nullOr types.str; default = null; description = "account: the credential pool."; };
          budget = mkOption { type = types.nullOr types.attrs; default = null; description = "budget: { usd; tokens; per; }."; };
          turnUsd = mkOption { type = types.nullOr types.float; default = null; description = "turn_usd."; };
        };
      });
      default = { };
      description = "The hive's agents by name (each entry may be an agent module's hyperhive.brokerEntry).";
    };

    up = {
      enable = mkEnableOption "the whole hive as one unit: hive up (broker, supervisor, dashboard, bash daemons) in place of the plain broker";
      user = mkOption { type = types.str; default = env.upDefaults.user; description = "The dedicated non-root user hive up and every agent run as."; };
      group = mkOption { type = types.str; default = env.upDefaults.group; description = "Its group."; };
      isolation = mkOption { type = types.enum [ "required" "auto" "off" ]; default = env.upDefaults.isolation; description = "HIVE_ISOLATION: required refuses to start without a sandbox per agent."; };
      listen = mkOption { type = types.str; default = env.upDefaults.listen; description = "web.listen: the dashboard's and every agent page's one address."; };
      publicOrigin = mkOption { type = types.nullOr types.str; default = env.upDefaults.publicOrigin; description = "web.public_origin, behind a reverse proxy."; };
      scriptPages = mkOption { type = types.attrsOf types.str; default = env.upDefaults.scriptPages; description = "web.script_pages."; };
      budget = mkOption { type = types.nullOr types.attrs; default = env.upDefaults.budget; description = "The hive's budget (budget)."; };
      retention = mkOption { type = types.nullOr types.attrs; default = env.upDefaults.retention; description = "retention."; };
      maxClaude = mkOption { type = types.nullOr types.ints.positive; default = env.upDefaults.maxClaude; description = "max_claude: the most claude processes the hive runs at once (default: from the host's memory)."; };
      notify = mkOption { type = types.nullOr types.attrs; default = env.upDefaults.notify; description = "notify: where the hive pushes what needs the operator (docs/config.md); secrets and URLs with tokens go in files (secret_file, url_file)."; };
      telemetry = mkOption { type = types.nullOr types.attrs; default = env.upDefaults.telemetry; description = "telemetry: where hive up exports the OTLP traces of every claude run (docs/config.md)."; };
      extraPackages = mkOption {
        type = types.listOf types.package;
        default = env.upDefaults.extraPackages;
        example = literalExpression "[ pkgs.claude-code ]";
        description = "Packages on the unit's PATH (every agent's) besides bash, coreutils and git: put the Claude Code CLI here.";
      };
      environment = mkOption { type = types.attrsOf types.str; default = env.upDefaults.environment; description = "More environment for hive up (docs/env.md)."; };
      fleetFile = mkOption { type = types.package; readOnly = true; description = "The generated (declared) fleet file."; };
    };
  };

  config = mkIf cfg.enable {
    environment.systemPackages = [ cfg.package ];
    environment.variables.HIVE_HOST_SOCKET = if up.enable then hostSocket else "${cfg.runDir}/host.sock";

    services.hyperhive.up.fleetFile = declared;

    # hive up: the whole hive in one unit (up.enable).
    users.users = mkIf up.enable {
      # Its home is not the data dir, which agents do not see (each agent's
      # HOME is its own state dir).
      ${up.user} = { isSystemUser = true; group = up.group; };
    };
    users.groups = mkIf up.enable { ${up.group} = { }; };
    system.activationScripts.hyperhive-fleet = mkIf up.enable {
      deps = [ "users" "groups" ];
      text = env.fleetActivation {
        hive = cfg.package;
        inherit declared;
        dataDir = cfg.stateDir;
        inherit (up) user group;
      };
    };
    systemd.services.hyperhive = mkIf up.enable {
      description = "hive up: the broker, every agent, the dashboard";
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      path = [ pkgs.bash pkgs.coreutils pkgs.git ] ++ up.extraPackages;
      environment = {
        RUST_LOG = "info";
        HIVE_ISOLATION = up.isolation;
        HIVE_HOST_SOCKET = hostSocket;
      } // up.environment;
      # A rebuild that changes only the fleet file runs `hive reload` (the
      # activation step has merged it by then); a new package restarts.
      reloadTriggers = [ declared ];
      restartTriggers = [ cfg.package ];
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/hive up --config ${cfg.stateDir}/hive.json --data ${cfg.stateDir}";
        ExecReload = "${cfg.package}/bin/hive reload --socket ${hostSocket}";
        User = up.user;
        Group = up.group;
        StateDirectory = lib.removePrefix "/var/lib/" cfg.stateDir;
        StateDirectoryMode = "0750";
        WorkingDirectory = cfg.stateDir;
        Restart = "always";
        RestartSec = 2;
        # SIGTERM to hive up alone: it stops every agent (each requeues its
        # message), then the broker.
        KillMode = "mixed";
        TimeoutStopSec = 60;
        LimitNOFILE = 65536;
        # The agents' sandboxes are user, mount and PID namespaces, each
        # with a fresh /proc: no RestrictNamespaces, PrivateUsers or
        # ProtectProc here, and no ProtectKernelTunables or ProtectKernelLogs,
        # whose mounts over /proc make the kernel refuse a fresh /proc to a
        # non-root user's namespace (the sandbox then cannot start, and
        # HIVE_ISOLATION=required stops hive up).
        NoNewPrivileges = true;
        PrivateTmp = true;
        ProtectKernelModules = true;
        ProtectControlGroups = true;
        RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" ];
        LockPersonality = true;
        SystemCallArchitectures = "native";
      };
    };

    systemd.services.hyperhive-broker = mkIf (!up.enable) {
      description = "hive broker";
      wantedBy = [ "multi-user.target" ];
      environment.RUST_LOG = "info";
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/hive broker --state-dir ${cfg.stateDir} --run-dir ${cfg.runDir} --config ${configFile} --durability ${cfg.durability}";
        # Root, so that it can hand each agent socket to its agent's uid.
        StateDirectory = lib.removePrefix "/var/lib/" cfg.stateDir;
        Restart = "always";
        RestartSec = 1;
        # hive raises its soft descriptor limit to this hard limit at start.
        LimitNOFILE = 65536;
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        PrivateDevices = true;
        ReadWritePaths = [ cfg.stateDir cfg.runDir ];
        RestrictAddressFamilies = [ "AF_UNIX" ];
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectControlGroups = true;
        LockPersonality = true;
        MemoryDenyWriteExecute = true;
        SystemCallArchitectures = "native";
      };
    };
    systemd.tmpfiles.rules = lib.optional (!up.enable) "d ${cfg.runDir} 0755 root root -";

    assertions = env.matrixAssertions { inherit (cfg) hiveName matrix; };

    # The bridge: network access, no capabilities. It runs as root because
    # the broker's bridge socket is root's (0600); it holds no capability to
    # act on anything else.
    # (hive up runs the bridge itself.)
    systemd.services.hyperhive-matrix-bridge = mkIf (cfg.matrix.enable && !up.enable) {
      description = "hive Matrix bridge";
      wantedBy = [ "multi-user.target" ];
      after = [ "hyperhive-broker.service" "network-online.target" ];
      wants = [ "hyperhive-broker.service" "network-online.target" ];
      environment.RUST_LOG = "info";
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/hive matrix-bridge --socket ${cfg.runDir}/bridge.sock --state-dir ${cfg.matrix.stateDir}";
        StateDirectory = lib.removePrefix "/var/lib/" cfg.matrix.stateDir;
        StateDirectoryMode = "0700";
        Restart = "always";
        RestartSec = 5;
        # A refused Matrix login (exit 2) waits for the operator.
        RestartPreventExitStatus = 2;
        NoNewPrivileges = true;
        CapabilityBoundingSet = "";
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        PrivateDevices = true;
        ReadWritePaths = [ cfg.runDir cfg.matrix.stateDir ];
        RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" ];
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectControlGroups = true;
        LockPersonality = true;
        MemoryDenyWriteExecute = true;
        SystemCallArchitectures = "native";
      };
    };
  };
}

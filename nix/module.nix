# NixOS module for one agent: `hyperhive.*` options (the agent.nix surface of
# the specification) turned into the `hive serve` unit, its user, the dashboard
# links file, the merged static tree and /etc/hyperhive/bash-env.sh. The option
# → environment mapping and every validation live in env.nix (pure, checked in
# CI); this file only declares options and wires NixOS. docs/deploy.md has the
# table of options and variables.
#
# The agent's broker socket comes from the host: bind-mount the broker's
# `RUN/agents/NAME` directory to /run/hive in the agent's container (or point
# `hyperhive.socket` at RUN/agents/NAME/mcp.sock on a shared host). Give the
# host module `hyperhive.brokerEntry` so allowedRecipients and toolGroups reach
# the broker, which enforces them.
{ config, lib, pkgs, ... }:

let
  cfg = config.hyperhive;
  env = import ./env.nix;
  # The host module's settings, when this host also runs the broker
  # (host.nix); each is the default of the agent option of the same name.
  host = config.services.hyperhive or { };
  fromHost = name: fallback: let v = host.${name} or null; in if v == null then fallback else v;
  inherit (lib) mkOption mkEnableOption mkIf types literalExpression;

  # Top-level names of the replacement dist, which extra files may not shadow.
  distEntries =
    if cfg.frontend.dist == null then [ ]
    else builtins.attrNames (builtins.readDir cfg.frontend.dist);

  extraFiles = lib.mapAttrsToList
    (name: e: { target = env.targetOf name e; inherit (e) source; })
    cfg.frontend.extraFiles;

  # frontend.extraFiles merged into one tree; layered over frontend.dist when
  # that is set (then served as HIVE_WEB_DIST), else served as HIVE_STATIC_DIR
  # next to the built-in page. The merge refuses to overwrite a file.
  merged = pkgs.runCommand "hyperhive-${cfg.label}-static" { } (''
    mkdir -p $out
  '' + lib.optionalString (cfg.frontend.dist != null) ''
    cp -r --no-preserve=mode ${cfg.frontend.dist}/. $out/
  '' + lib.concatMapStrings
    (f: ''
      if [ -e "$out/${f.target}" ]; then
        echo "frontend.extraFiles: ${f.target} already exists in the dist" >&2; exit 1
      fi
      mkdir -p "$(dirname "$out/${f.target}")"
      cp -r --no-preserve=mode ${f.source} "$out/${f.target}"
    '')
    extraFiles);

  hasExtra = cfg.frontend.extraFiles != { };

  envCfg = env.defaults // cfg // {
    inherit distEntries;
    icon = if cfg.icon == null then null else "${cfg.icon}";
    staticDir = if hasExtra && cfg.frontend.dist == null then merged else null;
    frontend = cfg.frontend // {
      dist =
        if cfg.frontend.dist == null then null
        else if hasExtra then merged
        else "${cfg.frontend.dist}";
    };
  };

  linksFile = pkgs.writeText "hyperhive-dashboard-links.json"
    (env.dashboardLinksJson cfg.dashboardLinks);

  bashEnv = pkgs.runCommand "hyperhive-bash-env.sh" { } ''
    ${cfg.package}/bin/hive env-script > $out
  '';

  d = env.defaults;
in
{
  # The bash-task daemon's own unit (hyperhive-bash.service).
  imports = [ ./bash-unit.nix ];

  options.hyperhive = {
    enable = mkEnableOption "the hyperhive agent harness (hive serve)";

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix { };
      defaultText = literalExpression "pkgs.callPackage ./package.nix { }";
      description = "The hive package.";
    };

    label = mkOption {
      type = types.str;
      description = "The agent's name at the broker (1-9 characters of a-z, 0-9, -).";
    };

    parent = mkOption {
      type = types.nullOr types.str;
      default = null;
      description = "The agent's topology parent; null makes a root agent under the operator. Goes to the broker through brokerEntry.";
    };

    stateDir = mkOption {
      type = types.str;
      default = "/var/lib/hyperhive/${cfg.label}";
      defaultText = literalExpression ''"/var/lib/hyperhive/''${label}"'';
      description = "The agent's durable state dir, claude's working directory.";
    };

    socket = mkOption {
      type = types.str;
      default = d.socket;
      description = "The agent's broker socket (HIVE_SOCKET).";
    };

    model = mkOption {
      type = types.nullOr types.str;
      default = d.model;
      description = "Default model (HIVE_DEFAULT_MODEL); null keeps the harness default.";
    };

    autoCompact = mkOption {
      type = types.bool;
      default = d.autoCompact;
      description = "Proactive compaction at the watermark (HIVE_AUTO_COMPACT).";
    };

    icon = mkOption {
      type = types.nullOr types.path;
      default = d.icon;
      description = "An SVG shown in the page header and as favicon (HIVE_ICON); null uses the hive mark.";
    };

    dashboardLinks = mkOption {
      type = types.listOf (types.submodule {
        options = {
          label = mkOption { type = types.str; };
          url = mkOption { type = types.str; };
          icon = mkOption { type = types.str; default = ""; };
        };
      });
      default = d.dashboardLinks;
      example = literalExpression ''[ { label = "Stats"; icon = "📊"; url = "http://localhost:9001/stats"; } ]'';
      description = "Extra links on the dashboard card, written to <state>/hyperhive-dashboard-links.json.";
    };

    frontend = {
      dist = mkOption {
        type = types.nullOr types.path;
        default = d.frontend.dist;
        description = "A directory that replaces the built-in page (HIVE_WEB_DIST).";
      };
      extraFiles = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            source = mkOption { type = types.path; description = "A file or directory."; };
            target = mkOption {
              type = types.nullOr types.str;
              default = null;
              description = "Path in the served tree; defaults to the attribute name.";
            };
          };
        });
        default = d.frontend.extraFiles;
        description = "Files layered over the web UI (HIVE_STATIC_DIR, or merged into frontend.dist).";
      };
    };

    forge.url = mkOption {
      type = types.str;
      default = d.forge.url;
      description = "Forgejo base URL for forge notifications and the tea login (HIVE_FORGE_URL); http(s) or empty.";
    };

    matrix.url = mkOption {
      type = types.str;
      default = d.matrix.url;
      description = "Matrix homeserver URL (HIVE_MATRIX_URL, for a matrix bridge; hive itself does not read it); http(s) or empty.";
    };

    claudeMarketplaces = mkOption {
      type = types.listOf types.str;
      default = d.claudeMarketplaces;
      description = "Sources for `claude plugin marketplace add` at boot (HIVE_CLAUDE_MARKETPLACES).";
    };

    claudePlugins = mkOption {
      type = types.listOf types.str;
      default = d.claudePlugins;
      description = "Specs for `claude plugin install` at boot (HIVE_CLAUDE_PLUGINS).";
    };

    claudePluginsAutoUpdate = mkOption {
      type = types.bool;
      default = d.claudePluginsAutoUpdate;
      description = "Run `claude plugin marketplace update` at boot (HIVE_CLAUDE_PLUGINS_AUTO_UPDATE).";
    };

    cargo.shortMessages = mkOption {
      type = types.bool;
      default = d.cargo.shortMessages;
      description = "Install /etc/hyperhive/bash-env.sh with the cargo function that adds --message-format short.";
    };

    toolGroups = mkOption {
      type = types.listOf types.str;
      default = d.toolGroups;
      description = "Tool groups (HIVE_TOOL_GROUPS, and tool_groups at the broker through brokerEntry).";
    };

    allowedRecipients = mkOption {
      type = types.listOf types.str;
      default = d.allowedRecipients;
      description = "When non-empty, the only names `send` accepts (the parent always); enforced by the broker through brokerEntry.";
    };

    web = {
      port = mkOption { type = types.port; default = d.web.port; description = "HIVE_PORT."; };
      bind = mkOption { type = types.str; default = d.web.bind; description = "HIVE_BIND."; };
    };

    extraPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
      example = literalExpression "[ pkgs.claude-code pkgs.cargo ]";
      description = "Packages on the unit's PATH besides bash, coreutils and git; the Claude Code CLI goes here (or set HIVE_CLAUDE_BIN in extraEnv).";
    };

    hiveName = mkOption {
      type = types.nullOr types.str;
      default = fromHost "hiveName" d.hiveName;
      defaultText = literalExpression "config.services.hyperhive.hiveName or null";
      description = "The hive's name for the prompt identity (HIVE_HIVE_NAME); the host module's hiveName when this host runs it.";
    };

    swarmName = mkOption {
      type = types.nullOr types.str;
      default = fromHost "swarmName" d.swarmName;
      defaultText = literalExpression "config.services.hyperhive.swarmName or null";
      description = "The swarm's name for the prompt identity (HIVE_SWARM_NAME); the host module's swarmName when this host runs it.";
    };

    operatorPronouns = mkOption {
      type = types.nullOr types.str;
      default = fromHost "operatorPronouns" d.operatorPronouns;
      defaultText = literalExpression "config.services.hyperhive.operatorPronouns or null";
      example = "they/them";
      description = "The operator's pronouns in the system prompt (HIVE_OPERATOR_PRONOUNS); null keeps the harness default (she/her).";
    };

    contextWindowTokens = mkOption {
      type = types.attrsOf types.ints.positive;
      default = fromHost "contextWindowTokens" d.contextWindowTokens;
      defaultText = literalExpression "config.services.hyperhive.contextWindowTokens or { }";
      example = literalExpression "{ sonnet = 1000000; opus = 1000000; haiku = 200000; }";
      description = "Context windows by a part of the model name (HIVE_CONTEXT_WINDOW_TOKENS_<KEY>); unset, the window the CLI reports wins. Set 1000000 only for models run with a 1M context.";
    };

    extraMcpServers = mkOption {
      type = types.attrsOf types.attrs;
      default = d.extraMcpServers;
      example = literalExpression ''{ search = { command = "/run/current-system/sw/bin/search-mcp"; args = [ ]; allowedTools = [ "*" ]; }; }'';
      description = "More MCP servers for claude (HIVE_EXTRA_MCP_SERVERS): command, args, env, and allowedTools (\"*\" = all of its tools).";
    };

    extraEnv = mkOption {
      type = types.attrsOf types.str;
      default = d.extraEnv;
      description = "More environment for hive serve (any variable of docs/env.md).";
    };

    user = {
      name = mkOption { type = types.str; default = "hive-${cfg.label}"; defaultText = "hive-<label>"; description = "Unix user of the agent."; };
      uid = mkOption { type = types.nullOr types.int; default = null; description = "Its uid (null: allocated)."; };
      gid = mkOption { type = types.nullOr types.int; default = null; description = "Its group's gid (null: allocated)."; };
      passwordlessSudo = mkOption {
        type = types.bool;
        default = true;
        description = "Grant the agent user NOPASSWD: ALL sudo.";
      };
    };

    brokerEntry = mkOption {
      type = types.attrs;
      readOnly = true;
      description = "This agent's entry for the host module's services.hyperhive.agents.";
    };
  };

  config = mkIf cfg.enable {
    assertions = env.assertions envCfg;

    hyperhive.brokerEntry = {
      inherit (cfg) parent model allowedRecipients toolGroups;
      socketUid = cfg.user.uid;
      socketGid = cfg.user.gid;
    };

    users.users.${cfg.user.name} = {
      isSystemUser = true;
      group = cfg.user.name;
      uid = cfg.user.uid;
      home = cfg.stateDir;
      shell = pkgs.bashInteractive;
    };
    users.groups.${cfg.user.name}.gid = cfg.user.gid;

    security.sudo.extraRules = lib.optional cfg.user.passwordlessSudo {
      users = [ cfg.user.name ];
      commands = [ { command = "ALL"; options = [ "NOPASSWD" ]; } ];
    };

    environment.etc."hyperhive/bash-env.sh" = mkIf cfg.cargo.shortMessages { source = bashEnv; };
    environment.systemPackages = [ cfg.package ];

    systemd.tmpfiles.rules = [
      "d ${cfg.stateDir} 0750 ${cfg.user.name} ${cfg.user.name} -"
      "L+ ${cfg.stateDir}/hyperhive-dashboard-links.json - - - - ${linksFile}"
    ];

    systemd.services.hyperhive-agent = {
      description = "hive agent ${cfg.label} (hive serve)";
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      path = [ pkgs.bash pkgs.coreutils pkgs.git ] ++ cfg.extraPackages;
      environment = env.agentEnv envCfg // { HOME = cfg.stateDir; };
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/hive serve --state-dir ${cfg.stateDir} --run-dir /run/hyperhive-agent";
        User = cfg.user.name;
        Group = cfg.user.name;
        # /run/hive-bash is the bash-task daemon's (bash-unit.nix).
        RuntimeDirectory = [ "hyperhive-agent" ];
        WorkingDirectory = cfg.stateDir;
        Restart = "always";
        RestartSec = 2;
        KillMode = "mixed";
        TimeoutStopSec = 30;
        # hive raises its soft descriptor limit to this hard limit at start.
        LimitNOFILE = 65536;
        # Hardening that leaves claude's shell tools working: sudo needs
        # setuid, so NoNewPrivileges follows passwordlessSudo.
        NoNewPrivileges = !cfg.user.passwordlessSudo;
        PrivateTmp = true;
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectControlGroups = true;
        RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" ];
        LockPersonality = true;
      };
    };
  };
}

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
{ config, lib, pkgs, ... }:

let
  cfg = config.services.hyperhive;
  env = import ./env.nix;
  inherit (lib) mkOption mkEnableOption mkIf types literalExpression;

  configFile = pkgs.writeText "hive.json" (env.hiveConfig {
    inherit (cfg) hiveName swarmName operatorGid matrix;
    agents = lib.mapAttrs (_: a: lib.filterAttrs (_: v: v != null) a) cfg.agents;
  });
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
        };
      });
      default = { };
      description = "The hive's agents by name (each entry may be an agent module's hyperhive.brokerEntry).";
    };
  };

  config = mkIf cfg.enable {
    environment.systemPackages = [ cfg.package ];
    environment.variables.HIVE_HOST_SOCKET = "${cfg.runDir}/host.sock";

    systemd.services.hyperhive-broker = {
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
    systemd.tmpfiles.rules = [ "d ${cfg.runDir} 0755 root root -" ];

    assertions = env.matrixAssertions { inherit (cfg) hiveName matrix; };

    # The bridge: network access, no capabilities. It runs as root because
    # the broker's bridge socket is root's (0600); it holds no capability to
    # act on anything else.
    systemd.services.hyperhive-matrix-bridge = mkIf cfg.matrix.enable {
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

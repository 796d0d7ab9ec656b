# NixOS module for the host side: `hive broker` with the hive config generated
# from `services.hyperhive.agents` (docs/config.md). Each agent entry can be an
# agent module's `hyperhive.brokerEntry`, e.g. for NixOS containers:
#
#   services.hyperhive.agents.ana = config.containers.ana.config.hyperhive.brokerEntry;
#
# `hive up` (the fleet command that also starts the harnesses) is the
# alternative to this unit; docs/systemd/hive-up.service is an example.
{ config, lib, pkgs, ... }:

let
  cfg = config.services.hyperhive;
  env = import ./env.nix;
  inherit (lib) mkOption mkEnableOption mkIf types literalExpression;

  configFile = pkgs.writeText "hive.json" (env.hiveConfig {
    inherit (cfg) hiveName swarmName operatorGid;
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
  };
}

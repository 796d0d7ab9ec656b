# A stub of nixpkgs' lib and pkgs for the wiring checks that evaluate the
# modules without nixpkgs (nix/tests-modules.nix, nix/tests-bash.nix,
# nix/tests-small.nix): option declarations come back as written, derivations
# are fixed store paths.
let
  lib = {
    mkOption = o: o;
    mkEnableOption = d: { default = false; description = d; };
    mkIf = cond: content: if cond then content else { };
    literalExpression = x: x;
    types =
      let t = name: { inherit name; }; in
      {
        bool = t "bool"; str = t "str"; int = t "int"; port = t "port";
        path = t "path"; package = t "package"; attrs = t "attrs";
        nullOr = _: t "nullOr"; listOf = _: t "listOf"; attrsOf = _: t "attrsOf";
        submodule = _: t "submodule"; enum = _: t "enum";
        either = _: _: t "either"; float = t "float";
        ints = { positive = t "ints.positive"; };
      };
    mapAttrsToList = f: a: map (n: f n a.${n}) (builtins.attrNames a);
    mapAttrs = builtins.mapAttrs;
    filterAttrs = p: a: builtins.listToAttrs (builtins.concatMap
      (n: if p n a.${n} then [ { name = n; value = a.${n}; } ] else [ ])
      (builtins.attrNames a));
    optionalString = c: s: if c then s else "";
    concatMapStrings = f: l: builtins.concatStringsSep "" (map f l);
    optional = c: x: if c then [ x ] else [ ];
    removePrefix = p: s:
      let n = builtins.stringLength p; in
      if builtins.substring 0 n s == p then builtins.substring n (-1) s else s;
  };
  drv = name: { outPath = "/nix/store/stub-${name}"; inherit name; };
  pkgs = {
    runCommand = name: _: _: drv name;
    writeText = name: text: drv name // { inherit text; };
    callPackage = _: _: drv "hive";
    bash = drv "bash"; coreutils = drv "coreutils"; git = drv "git";
    bashInteractive = drv "bash-interactive"; claude-code = drv "claude-code";
  };
in
{ inherit lib pkgs drv; }

# hyperhive bash environment: installed as /etc/hyperhive/bash-env.sh (print it
# with `hive env-script`). Bash tasks of `hive serve` run with BASH_ENV set to
# this file, so every non-interactive bash the agent starts sources it.

# cargo: appends `--message-format short` to compile subcommands, so claude sees
# warnings and errors without a line of progress per crate. Commands that already
# choose a message format, other subcommands (new, add, third-party cargo-*) and
# everything after `--` pass through untouched.
cargo() {
    local -a head=() rest=()
    local sub="" arg
    # `+toolchain` and global options come before the subcommand.
    while [ $# -gt 0 ]; do
        arg=$1
        case $arg in
            +*) head+=("$arg"); shift ;;
            --config|--color|-Z|-C|--explain)
                head+=("$arg"); shift
                if [ $# -gt 0 ]; then head+=("$1"); shift; fi ;;
            --) break ;;
            -*) head+=("$arg"); shift ;;
            *) sub=$arg; shift; break ;;
        esac
    done
    case $sub in
        build|b|check|c|clippy|test|t|run|r|doc|d|bench|install|rustc|fix) ;;
        *) command cargo ${head[@]+"${head[@]}"} ${sub:+"$sub"} "$@"; return ;;
    esac
    # Options up to `--` belong to cargo; the rest to the program or test binary.
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        case $1 in
            --message-format|--message-format=*)
                command cargo ${head[@]+"${head[@]}"} "$sub" ${rest[@]+"${rest[@]}"} "$@"
                return ;;
        esac
        rest+=("$1"); shift
    done
    command cargo ${head[@]+"${head[@]}"} "$sub" ${rest[@]+"${rest[@]}"} --message-format short "$@"
}

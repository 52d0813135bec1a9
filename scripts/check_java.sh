#!/usr/bin/env bash
# Spark needs Java 17 or 21 (as statekit.engine.spark.jvm.JAVA_MAJORS). Say how to get one when it is missing.
set -u
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  cat >&2 <<'MSG'
statekit: Java was not found, and Spark needs Java 17 or 21.
  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless
  macOS:          brew install openjdk@17
  conda:          conda install -c conda-forge openjdk=17
Then run the make target again (or set JAVA_HOME).
MSG
  exit 1
fi
ver=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n1)  # "1.8.0" is 8
case "$ver" in
  17|21) exit 0 ;;
  *) echo "statekit: found Java $ver, but Spark needs Java 17 or 21 (sudo apt-get install -y openjdk-17-jre-headless, or set JAVA_HOME)." >&2; exit 1 ;;
esac

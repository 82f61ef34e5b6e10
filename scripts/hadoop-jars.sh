#!/usr/bin/env bash
# Fetches Apache Hadoop's client jars (hadoop-client and its runtime dependencies, the version in
# scripts/hadoop/pom.xml) from Maven Central into target/hadoop-jars, with a conf directory
# (an empty core-site.xml, quiet logging) beside them: what the WebHDFS tests run Hadoop's
# FsShell from. Needs Java and Maven. Usage: scripts/hadoop-jars.sh [DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/hadoop-jars}"
mkdir -p "$out/lib" "$out/conf"
if ! command -v mvn >/dev/null 2>&1; then
    echo "hadoop-jars: mvn not found (apt install maven)" >&2
    exit 1
fi
mvn -q -B --no-transfer-progress -Dstyle.color=never -f "$root/scripts/hadoop/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$out/lib"
cat > "$out/conf/core-site.xml" <<'XML'
<?xml version="1.0"?>
<configuration></configuration>
XML
cat > "$out/conf/log4j.properties" <<'PROPS'
log4j.rootLogger=WARN,err
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
log4j.appender.err=org.apache.log4j.ConsoleAppender
log4j.appender.err.target=System.err
log4j.appender.err.layout=org.apache.log4j.PatternLayout
log4j.appender.err.layout.ConversionPattern=%p %c: %m%n
PROPS
echo "hadoop-jars: $(ls "$out/lib" | wc -l) jars in $out/lib; run FsShell with:"
echo "  java -cp '$out/conf:$out/lib/*' org.apache.hadoop.fs.FsShell -fs webhdfs://127.0.0.1:9870 -ls /"

#!/usr/bin/env bash
# Fetch Apache Kafka (KRaft) and its runtime jars from Maven Central with Maven.
#
# deploy/kafka/pom.xml pins the version; the jars land in
# ~/.cache/eroica/kafka/<version>/libs (or $EROICA_KAFKA_LIBS), where
# eroica.stack.apache_kafka finds them (test fixtures, `eroica up --broker kafka`).
# Maven caches what it downloads in ~/.m2, so a second machine setup is offline.
#
# Idempotent: does nothing when the directory is complete for this pom (a
# stamp holds the pom's hash). Installs a JRE and Maven from Debian when they
# are missing and we may (root or sudo); fails otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
POM=deploy/kafka/pom.xml
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n1)
LIBS="${EROICA_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/eroica/kafka/$VERSION/libs}"
STAMP="$LIBS/.eroica-complete"
HASH=$(sha256sum "$POM" | cut -c1-64)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
    echo "Apache Kafka $VERSION already in $LIBS"
    exit 0
fi

if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            echo "install-kafka: java and mvn are needed (apt-get install openjdk-17-jre-headless maven)" >&2
            exit 1
        fi
    fi
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless maven
fi

TMP="$LIBS.tmp.$$"
rm -rf "$TMP"
mkdir -p "$(dirname "$LIBS")"
trap 'rm -rf "$TMP"' EXIT
mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$TMP"
ls "$TMP"/kafka_2.13-"$VERSION".jar "$TMP"/kafka-server-"$VERSION".jar >/dev/null
echo "$HASH" > "$TMP/.eroica-complete"
rm -rf "$LIBS"
mv "$TMP" "$LIBS"
echo "installed Apache Kafka $VERSION ($(ls "$LIBS"/*.jar | wc -l) jars) in $LIBS"

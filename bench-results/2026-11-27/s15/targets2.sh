#!/bin/bash
b=$1; A="$(dirname "$0")/../s14/ab.sh"
OUT=/tmp/s15 bash $A sqlite drain 3 f:$b
OUT=/tmp/s15 bash $A sqlite dag 3 f:$b
EXTRA="--jobs 200000" OUT=/tmp/s15 bash $A sqlite submit 3 f:$b
OUT=/tmp/s15 bash $A postgres drain 3 f:$b

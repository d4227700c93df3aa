#!/bin/sh
# Onboard a tenant's offline cluster onto an online member cluster, or offboard it:
#   sh tenant-onboarding.sh onboard | offboard
# Run with the admin kubeconfigs of both clusters. Set these (or edit the defaults): the tenant's
# name, the front end's and the member's kubeconfigs, the member's name at the front end, where
# the member's capacity agent (`federation agent`, run by the member's owner) listens, and
# optionally the tenant's quota in the member.
set -eu
: "${TENANT:=teama}"
: "${FRONT_END:=offline.yaml}"
: "${MEMBER:=online-1.yaml}"
: "${MEMBER_NAME:=$TENANT-online-1}"
: "${AGENT:=capacity-agent.online-1:50051}"
: "${NAMESPACE:=vkprovider}"      # the front-end namespace of the member's kubeconfig Secret
: "${QUOTA:=}"                    # e.g. cpu=64,memory=256Gi,nvidia.com/gpu=8

case "${1:-onboard}" in
onboard)
    # Checks first, then the plan, then the changes; add --dry-run to print the plan only.
    vkprovider onboard --tenant "$TENANT" --front-end-kubeconfig "$FRONT_END" \
        --member-kubeconfig "$MEMBER" --member-name "$MEMBER_NAME" --namespace "$NAMESPACE" \
        --agent-address "$AGENT" --pod-security baseline ${QUOTA:+--quota "$QUOTA"}
    # The tenant's provider then takes only its own MemberClusters:
    #   helm install ... --set federation.memberSelector=vkprovider.io/tenant=$TENANT
    ;;
offboard)
    # Drains the tenant's pods through checkpoint notices, then deletes what onboarding made.
    vkprovider offboard --tenant "$TENANT" --front-end-kubeconfig "$FRONT_END" \
        --member-kubeconfig "$MEMBER" --member-name "$MEMBER_NAME" --namespace "$NAMESPACE"
    ;;
*)
    echo "usage: $0 onboard|offboard" >&2
    exit 2
    ;;
esac

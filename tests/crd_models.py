"""Typed models of the two canary-analysis kinds graphmon ships (docker/k8s/canary-analysis.yaml), for
tests/deploy/test_k8s.py's round trip: the fields of Argo Rollouts' AnalysisTemplate
(argoproj.io/v1alpha1) and Flagger's MetricTemplate (flagger.app/v1beta1) as their CRDs name and type
them, for the parts these manifests use. Why by hand: neither project publishes Python models (the
PodMonitor's come from cloudcoil's, generated from prometheus-operator's CRDs). As with those
models, an unknown (misspelt) key is dropped, so the round trip differs; a wrong type raises."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _M(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ObjectMeta(_M):
    name: str
    namespace: Optional[str] = None
    labels: Optional[dict[str, str]] = None
    annotations: Optional[dict[str, str]] = None


# ---------------------------------------------------------------- Argo Rollouts
class ArgValueFrom(_M):
    secret_key_ref: Optional[dict[str, str]] = Field(None, alias="secretKeyRef")
    field_ref: Optional[dict[str, str]] = Field(None, alias="fieldRef")


class Argument(_M):
    name: str
    value: Optional[str] = None
    value_from: Optional[ArgValueFrom] = Field(None, alias="valueFrom")


class PrometheusMetric(_M):
    address: Optional[str] = None
    query: Optional[str] = None
    timeout: Optional[int] = None
    insecure: Optional[bool] = None


class MetricProvider(_M):
    prometheus: Optional[PrometheusMetric] = None


IntOrString = Union[int, str]


class Metric(_M):
    name: str
    interval: Optional[str] = None
    initial_delay: Optional[str] = Field(None, alias="initialDelay")
    count: Optional[IntOrString] = None
    success_condition: Optional[str] = Field(None, alias="successCondition")
    failure_condition: Optional[str] = Field(None, alias="failureCondition")
    failure_limit: Optional[IntOrString] = Field(None, alias="failureLimit")
    inconclusive_limit: Optional[IntOrString] = Field(None, alias="inconclusiveLimit")
    consecutive_error_limit: Optional[IntOrString] = Field(None, alias="consecutiveErrorLimit")
    provider: MetricProvider


class AnalysisTemplateSpec(_M):
    args: Optional[list[Argument]] = None
    metrics: list[Metric]


class AnalysisTemplate(_M):
    api_version: Literal["argoproj.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["AnalysisTemplate"]
    metadata: ObjectMeta
    spec: AnalysisTemplateSpec


# ---------------------------------------------------------------- Flagger
class MetricTemplateProvider(_M):
    type: Literal["prometheus", "influxdb", "datadog", "cloudwatch", "newrelic", "graphite", "dynatrace",
                  "keptn", "splunk", "stackdriver"]
    address: Optional[str] = None
    secret_ref: Optional[dict[str, str]] = Field(None, alias="secretRef")
    insecure_skip_verify: Optional[bool] = Field(None, alias="insecureSkipVerify")


class MetricTemplateSpec(_M):
    provider: MetricTemplateProvider
    query: str


class MetricTemplate(_M):
    api_version: Literal["flagger.app/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["MetricTemplate"]
    metadata: ObjectMeta
    spec: MetricTemplateSpec
